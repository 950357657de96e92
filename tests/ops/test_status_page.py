"""The status page in a real headless Chromium (Debian's), open through a real hang.

The page was opened before the job started (tests/ops/conftest.py) and is never reloaded: it must
have shown the job healthy, then DEADLOCK with its culprit, by itself, updating in place (a text
selection survives its polls). Screenshots go to artifacts/ (status-page-healthy.png,
status-page-deadlock.png; the latter is docs/status-page.png in the README).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from agent.stacks import NATIVE_DUMP_TIMEOUT_S, NATIVE_OFF_AFTER_TIMEOUT_S
from tests.ops.conftest import GRAFANA_URL, RUNBOOK_URL, LiveHang, is_loopback

pytestmark = pytest.mark.e2e

SHOW_TIMEOUT_MS = 15_000
# The agent dumps native frames of a stuck rank a little after it sees it stuck.
NATIVE_TIMEOUT_MS = 30_000
# A rank's native dump that timed out on the loaded machine turns its native dumps off for a while
# (agent/stacks.py); the next one comes after that, so a rank's own native frames may take this long.
NATIVE_RETRY_TIMEOUT_MS = int((NATIVE_DUMP_TIMEOUT_S + NATIVE_OFF_AFTER_TIMEOUT_S) * 1000) + NATIVE_TIMEOUT_MS
TIME_WITH_ZONE = r"\d\d:\d\d:\d\d UTC([+-]\d\d:\d\d)?"


def job_card(live: LiveHang):
    return live.page.locator(f'section[id="job-{live.job.job_id}"]')


def shown_deadlock(live: LiveHang):
    card = job_card(live)
    card.locator("h2 .verdict", has_text="DEADLOCK").wait_for(timeout=SHOW_TIMEOUT_MS)
    return card


def tree_rows(card) -> list[dict]:
    return card.evaluate("""card => Array.from(card.querySelectorAll('.stack-tree .node')).map(row => ({
        cls: row.className, frame: (row.querySelector('.frame') || {}).textContent || '',
        ranks: row.querySelector('.ranks').textContent,
        missing: Array.from(row.querySelectorAll('.missing')).map(m => m.textContent)}))""")


def full_polls(page) -> int:
    """How many full /diagnose answers the page has fetched so far."""
    return page.evaluate("performance.getEntriesByType('resource')"
                         ".filter(e => e.name.endsWith('/diagnose?format=json')).length")


def test_page_shows_the_deadlock_and_its_culprit(live_hang: LiveHang, artifacts: Path) -> None:
    live, page = live_hang, live_hang.page
    card = shown_deadlock(live)
    assert live.job.job_id in card.locator("h2").inner_text()
    assert "culprit ranks: 1" in card.inner_text()
    # The jobs-at-a-glance bar names the job with its verdict.
    assert "DEADLOCK" in page.locator("#overview").inner_text()
    assert live.job.job_id in page.locator("#overview").inner_text()
    # Progress over time: the job's step line(s) in an inline SVG, and the marker where it stalled.
    chart = card.locator("svg.progress")
    chart.wait_for(timeout=SHOW_TIMEOUT_MS)
    assert chart.locator("path.series").count() >= 1
    assert chart.locator("line.since").count() == 1
    # The screenshot for the README: the timeline drawn, the native frames folded.
    card.locator(".timeline .trow .seg.st-in_collective").first.wait_for(timeout=SHOW_TIMEOUT_MS)
    card.locator(".stack-tree .node.fold").first.wait_for(timeout=NATIVE_TIMEOUT_MS)
    page.screenshot(path=str(artifacts / "status-page-deadlock.png"), full_page=True)


def test_merged_stack_tree_marks_the_ranks_missing_at_each_frame(live_hang: LiveHang) -> None:
    card = shown_deadlock(live_hang)
    card.locator(".stack-tree .frame", has_text="linger_forever").wait_for(timeout=SHOW_TIMEOUT_MS)
    rows = tree_rows(card)
    waiting = next(r for r in rows if r["frame"].startswith("all_reduce ("))
    assert waiting["ranks"] == "rank 0" and waiting["missing"] == ["missing: rank 1"], rows
    odd = next(r for r in rows if r["frame"].startswith("linger_forever (train.py"))
    assert odd["ranks"] == "rank 1" and odd["missing"] == ["missing: rank 0"], rows
    # The frames both ranks pass through (the script's own <module>) miss nobody.
    assert any(r["ranks"] == "ranks 0,1" and r["missing"] == [] and "train.py" in r["frame"] for r in rows), rows
    # The mark stands out where a rank goes missing first: the two frames where the ranks part.
    assert card.locator(".stack-tree .missing.new").count() == 2, rows


def test_native_frames_fold_and_unfold(live_hang: LiveHang) -> None:
    card = shown_deadlock(live_hang)
    fold = card.locator(".stack-tree .node.fold")
    fold.first.wait_for(timeout=NATIVE_TIMEOUT_MS)
    toggle = card.locator(".stack-tree button.toggle-native")
    assert toggle.get_attribute("aria-pressed") == "false"
    assert card.locator(".stack-tree .node.native").count() == 0  # folded by default
    folded = fold.first.inner_text()
    assert re.search(r"\d+ native frames?", folded), folded

    toggle.click()
    card.locator(".stack-tree .node.native").first.wait_for(timeout=SHOW_TIMEOUT_MS)
    assert fold.count() == 0 and toggle.get_attribute("aria-pressed") == "true"
    # Where rank 0 waits under all_reduce, as py-spy --native shows it (FIELD-NOTES: gloo). Each
    # rank's native frames come with its own native dump: rank 1's (asleep in linger_forever) may be
    # shown first, rank 0's with a later poll. (CI saw only rank 1's, ['time_sleep', 'clock_nanosleep'],
    # for 30 s: rank 0's native dump had timed out on the loaded machine, and native dumps stay off
    # for a minute after that: the wait covers the retry.)
    waits = card.locator(".stack-tree .node.native .frame", has_text=re.compile("wait", re.IGNORECASE))
    try:
        waits.first.wait_for(timeout=NATIVE_RETRY_TIMEOUT_MS)
    except PlaywrightTimeout as exc:  # say what the tree showed instead, and what the agent said
        shown = [r["frame"] for r in tree_rows(card) if "native" in r["cls"].split()]
        raise AssertionError(f"{shown}\n--- agent log\n{live_hang.agent.log_tail(15)}") from exc
    # It stays unfolded through the next polls (the page keeps the choice), then folds again.
    polls = full_polls(live_hang.page)
    live_hang.page.wait_for_function(f"() => performance.getEntriesByType('resource')"
                                     f".filter(e => e.name.endsWith('/diagnose?format=json')).length >= {polls + 2}",
                                     timeout=SHOW_TIMEOUT_MS)
    assert card.locator(".stack-tree .node.native").count() > 0 and toggle.get_attribute("aria-pressed") == "true"
    toggle.click()
    fold.first.wait_for(timeout=SHOW_TIMEOUT_MS)
    assert card.locator(".stack-tree .node.native").count() == 0


def test_a_text_selection_survives_two_polls(live_hang: LiveHang) -> None:
    live, page = live_hang, live_hang.page
    card = shown_deadlock(live)
    frame = card.locator(".stack-tree .frame", has_text="linger_forever")
    frame.wait_for(timeout=SHOW_TIMEOUT_MS)
    selected = frame.evaluate("""node => {
        const range = document.createRange();
        range.selectNodeContents(node);
        getSelection().removeAllRanges();
        getSelection().addRange(range);
        window.__selectedFrame = node;
        return getSelection().toString();
    }""")
    assert selected.startswith("linger_forever (train.py"), selected
    polls = full_polls(page)
    # Three fetches on: two whole polls were drawn (a poll schedules the next after drawing).
    page.wait_for_function(f"() => performance.getEntriesByType('resource')"
                           f".filter(e => e.name.endsWith('/diagnose?format=json')).length >= {polls + 3}",
                           timeout=SHOW_TIMEOUT_MS)
    assert page.evaluate("getSelection().toString()") == selected
    assert page.evaluate("getSelection().rangeCount") == 1
    assert page.evaluate("window.__selectedFrame.isConnected")
    assert page.evaluate("getSelection().anchorNode === window.__selectedFrame"
                         " || window.__selectedFrame.contains(getSelection().anchorNode)")


def test_rank_timeline_shows_each_ranks_states(live_hang: LiveHang) -> None:
    card = shown_deadlock(live_hang)
    card.locator('.timeline .trow[data-rank="0"] .seg.st-in_collective').wait_for(timeout=SHOW_TIMEOUT_MS)
    rows = card.evaluate("""card => Array.from(card.querySelectorAll('.timeline .trow')).map(row => ({
        rank: row.dataset.rank, cls: row.className,
        states: Array.from(row.querySelectorAll('.seg')).map(s => s.className.replace('seg ', '')),
        width: row.querySelector('.tbar').getBoundingClientRect().width,
        drawn: Array.from(row.querySelectorAll('.seg:not(.none)')).reduce((w, s) => w + s.getBoundingClientRect().width, 0)}))""")
    assert [(r["rank"], r["cls"]) for r in rows] == [("1", "trow culprit"), ("0", "trow")], rows
    culprit, waiting = rows
    assert waiting["states"][-1] == "st-in_collective", waiting
    # Healthy first (the page and the monitor watched it start), then the wait: at least two states.
    assert len({s for s in waiting["states"] if s != "none"}) >= 2, waiting
    assert culprit["states"][-1] not in ("none", "st-in_collective"), culprit
    for row in rows:
        assert 0 < row["drawn"] <= row["width"] + 1, row
    legend = card.locator(".timeline .legend").inner_text()
    assert "in_collective" in legend, legend
    title = card.locator('.timeline .trow[data-rank="0"] .seg.st-in_collective').last.get_attribute("title")
    assert re.fullmatch(f"rank 0: in_collective {TIME_WITH_ZONE} – now", title), title


def test_evidence_download_holds_the_job_its_history_and_timeline(live_hang: LiveHang, artifacts: Path) -> None:
    live, page = live_hang, live_hang.page
    card = shown_deadlock(live)
    link = card.locator("a.evidence")
    assert link.get_attribute("download") == ""
    with page.expect_download(timeout=SHOW_TIMEOUT_MS) as caught:
        link.click()
    download = caught.value
    assert download.failure() is None
    assert re.fullmatch(r"hangwatch-evidence-127\.0\.0\.1_\d+-\d{8}T\d{6}Z\.json", download.suggested_filename)
    saved = artifacts / download.suggested_filename
    download.save_as(str(saved))
    evidence = json.loads(saved.read_text())
    assert evidence["job"]["job_id"] == live.job.job_id and evidence["job"]["verdict"] == "deadlock"
    assert evidence["job"]["culprit_ranks"] == [1]
    assert evidence["job"]["stack_tree"]["roots"], evidence["job"]["stack_tree"]
    verdicts = [change["verdict"] for change in evidence["history"]]
    assert "healthy" in verdicts and verdicts[-1] == "deadlock", verdicts
    assert [r["rank"] for r in evidence["rank_timeline"]["ranks"]] == [0, 1]
    assert evidence["monitor"]["links"]["grafana"] == GRAFANA_URL


def test_links_to_grafana_and_the_runbook_section(live_hang: LiveHang) -> None:
    card = shown_deadlock(live_hang)
    grafana = card.locator("a.grafana")
    assert grafana.get_attribute("href") == GRAFANA_URL.replace("{job}", quote(live_hang.job.job_id, safe=""))
    runbook = card.locator("a.runbook")
    assert runbook.get_attribute("href") == RUNBOOK_URL + "#deadlock"
    assert runbook.inner_text() == "runbook: deadlock"
    # Opened in a new tab, and never followed by this test: nothing may leave loopback.
    assert grafana.get_attribute("target") == "_blank" and "noopener" in grafana.get_attribute("rel")


def test_times_carry_their_zone(live_hang: LiveHang, browser) -> None:
    """In a browser set to India's zone (UTC+05:30, no summer time) every time on the page says so."""
    context = browser.new_context(timezone_id="Asia/Kolkata", viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(live_hang.monitor.url + "/", wait_until="load")
        card = page.locator(f'section[id="job-{live_hang.job.job_id}"]')
        card.locator("h2 .verdict", has_text="DEADLOCK").wait_for(timeout=SHOW_TIMEOUT_MS)
        card.locator(".history li").first.wait_for(timeout=SHOW_TIMEOUT_MS)
        zone = "UTC+05:30"
        heading = card.locator("h2").inner_text()
        assert re.search(rf"since \d\d:\d\d:\d\d {re.escape(zone)}", heading), heading
        assert re.search(rf"last report \d\d:\d\d:\d\d {re.escape(zone)}", heading), heading
        assert re.fullmatch(rf"updated \d\d:\d\d:\d\d {re.escape(zone)}", page.locator("#status").inner_text())
        for when in card.locator(".history li .meta:first-child").all_inner_texts():
            assert re.fullmatch(rf"\d\d:\d\d:\d\d {re.escape(zone)}", when), when
        label = card.locator("svg.progress .since-label").text_content()
        assert re.fullmatch(rf"deadlock since \d\d:\d\d:\d\d {re.escape(zone)}", label), label
        # The moment the monitor gives, read 5 h 30 min ahead of UTC.
        answer = httpx.get(live_hang.monitor.url + "/diagnose", params={"format": "json", "job": live_hang.job.job_id},
                           timeout=10).json()
        since = answer["jobs"][0]["since"]
        assert f"since {time.strftime('%H:%M:%S', time.gmtime(since + 5.5 * 3600))} {zone}" in heading, (heading, since)
        # The heading's two times of the change: when it began (since) and when it was named, the
        # time the verdict history gives the same change (one person's question: which is right?).
        card.locator("h2", has_text="named").wait_for(timeout=SHOW_TIMEOUT_MS)
        heading = card.locator("h2").inner_text()
        newest = card.locator(".history li").first
        assert newest.locator(".verdict").inner_text() == "DEADLOCK"
        named = newest.locator(".meta").first.inner_text()
        assert f"named {named}" in heading, (heading, named)
    finally:
        context.close()


def test_per_rank_table(live_hang: LiveHang) -> None:
    card = shown_deadlock(live_hang)
    headers = [h.strip() for h in card.locator("table thead th").all_inner_texts()]
    for column in ("rank", "state", "CPU %", "step", "no progress for", "top frame"):
        assert column in headers, headers
    rows = {}
    for tr in card.locator("table tbody tr").all():
        cells = dict(zip(headers, (c.strip() for c in tr.locator("td").all_inner_texts())))
        rows[cells["rank"]] = (cells, tr.get_attribute("class") or "")
    assert set(rows) == {"0", "1"}, rows
    assert "culprit" in rows["1"][1] and "culprit" not in rows["0"][1]
    waiting, _ = rows["0"]
    assert waiting["state"] == "in_collective", waiting
    assert "all_reduce" in waiting["top frame"], waiting
    for cells, _ in rows.values():
        assert cells["step"] not in ("", "–") and cells["CPU %"] not in ("", "–"), cells


def test_page_updated_live_without_reload(live_hang: LiveHang) -> None:
    live, page = live_hang, live_hang.page
    shown_deadlock(live)
    seen = page.evaluate("window.__seen")
    mine = [s["text"] for s in seen if live.job.job_id in s["text"]]
    healthy = [i for i, text in enumerate(mine) if "HEALTHY" in text]
    deadlock = [i for i, text in enumerate(mine) if "DEADLOCK" in text]
    assert healthy and deadlock and healthy[0] < deadlock[0], seen
    # One document, loaded once: the recorder's history started before the job existed.
    assert live.navigations == [live.monitor.url + "/"], live.navigations
    assert page.evaluate("performance.getEntriesByType('navigation').map(e => e.type)") == ["navigate"]
    assert seen[0]["text"] == "" or live.job.job_id not in seen[0]["text"], seen[0]
    polls = [u for u in live.requests if "/diagnose?format=json" in u]
    assert len(polls) >= 5, live.requests


def test_page_stays_on_loopback(live_hang: LiveHang) -> None:
    live = live_hang
    assert live.requests and all(is_loopback(u) for u in live.requests), live.requests
    # Chromium asks for /favicon.ico by itself; the page has no icon (a 404 and its console line).
    errors = [e for e in live.page_errors if not e.endswith("/favicon.ico")
              and e != "Failed to load resource: the server responded with a status of 404 (Not Found)"]
    assert not errors, live.page_errors
    assert all(e.endswith("/favicon.ico") for e in live.page_errors if e.startswith("HTTP ")), live.page_errors


def test_the_deadlocked_jobs_node_is_listed_as_a_suspect(live_hang: LiveHang) -> None:
    """The incident named rank 1's node: the page lists it under suspect nodes, with the job."""
    live, page = live_hang, live_hang.page
    shown_deadlock(live)
    node = next(r["node"] for r in live.diagnosis["ranks"] if r["rank"] == 1)
    row = page.locator("#suspects table.suspects tbody tr", has_text=node)
    row.wait_for(timeout=30_000)  # read again every 15 s
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == node and int(cells[1]) >= 1, cells
    assert "DEADLOCK" in cells[3] and live.job.job_id in cells[5], cells
    assert "Suspect nodes" in page.locator("#suspects h2").inner_text()
