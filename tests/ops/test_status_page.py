"""The status page in a real headless Chromium (Debian's), open through a real hang.

The page was opened before the job started (tests/ops/conftest.py) and is never reloaded: it must
have shown the job healthy, then DEADLOCK with its culprit, by itself. Screenshots go to
artifacts/ (status-page-healthy.png, status-page-deadlock.png).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ops.conftest import LiveHang, is_loopback

pytestmark = pytest.mark.e2e

SHOW_TIMEOUT_MS = 15_000


def job_card(live: LiveHang):
    return live.page.locator(f'section[id="job-{live.job.job_id}"]')


def test_page_shows_the_deadlock_and_its_culprit(live_hang: LiveHang, artifacts: Path) -> None:
    live, page = live_hang, live_hang.page
    card = job_card(live)
    card.locator("h2 .verdict", has_text="DEADLOCK").wait_for(timeout=SHOW_TIMEOUT_MS)
    assert live.job.job_id in card.locator("h2").inner_text()
    assert "culprit ranks: 1" in card.inner_text()
    # The jobs-at-a-glance bar names the job with its verdict.
    assert "DEADLOCK" in page.locator("#overview").inner_text()
    assert live.job.job_id in page.locator("#overview").inner_text()
    # The merged stack view of the stalled job: one group per distinct stack, the odd one out last.
    stacks = card.locator(".groups")
    assert "stacks (innermost first)" in stacks.inner_text().lower()
    groups = stacks.locator("li").all_inner_texts()
    assert len(groups) == 2 and groups[0].startswith("rank 0:") and "all_reduce" in groups[0], groups
    assert groups[1].startswith("rank 1:") and "linger_forever (train.py" in groups[1], groups
    # Progress over time: the job's step line(s) in an inline SVG, and the marker where it stalled.
    chart = card.locator("svg.progress")
    chart.wait_for(timeout=SHOW_TIMEOUT_MS)
    assert chart.locator("path.series").count() >= 1
    assert chart.locator("line.since").count() == 1
    page.screenshot(path=str(artifacts / "status-page-deadlock.png"), full_page=True)


def test_per_rank_table(live_hang: LiveHang) -> None:
    card = job_card(live_hang)
    card.locator("h2 .verdict", has_text="DEADLOCK").wait_for(timeout=SHOW_TIMEOUT_MS)
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
    card = job_card(live)
    card.locator("h2 .verdict", has_text="DEADLOCK").wait_for(timeout=SHOW_TIMEOUT_MS)
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
