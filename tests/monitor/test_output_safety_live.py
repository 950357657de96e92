"""The payloads of test_output_safety.py against the real thing: the monitor on uvicorn on
loopback, the ``hangwatch`` command in a subprocess, promtool and prometheus_client's parser on
/metrics, and the status page in a headless Chromium under its Content-Security-Policy.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from monitor_reports import progress
from test_output_safety import (
    JOB,
    LABEL_JOB,
    PAYLOAD,
    UNSAFE,
    assert_exact_json,
    assert_safe_text,
    assert_security_headers,
    payload_report,
)

from hangwatch.demo.harness import LOOPBACK, Reaper, free_port, stop_gently, wait_until_ready

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

PROMTOOL = "/usr/bin/promtool"
CHROMIUM = "/usr/bin/chromium"
HANGWATCH = [sys.executable, "-m", "hangwatch.cli"]
# The colour codes hangwatch adds itself (hangwatch/colour.py): the only escapes allowed out.
OWN_COLOUR = re.compile(r"\x1b\[(?:0|32|33|1;31)m")


@pytest.fixture(scope="module")
def monitor_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("output-safety")
    log = workdir / "monitor.log"
    url = f"http://{LOOPBACK}:{free_port()}"
    with Reaper() as reaper, open(log, "wb") as out:
        proc = reaper.popen([sys.executable, "-m", "monitor.web.cli", "--host", LOOPBACK, "--port", url.rsplit(":", 1)[1],
                             "--db", str(workdir / "monitor.db"), "--log-level", "warning"],
                            stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until_ready(proc, url + "/healthz", "monitor", lambda: log.read_text(errors="replace"), 30.0)
            body = payload_report(time.time())
            now = body["sent_at"]
            # Steps for the label job, so the page draws its chart (and colours the legend).
            body["ranks"][2]["progress"] = progress(3, 20, [(now - 20, 10), (now - 10, 20)])
            assert httpx.post(url + "/api/v1/reports", json=body, timeout=10).status_code == 202
            yield url
        finally:
            stop_gently(proc)


def hangwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HANGWATCH, *args], capture_output=True, text=True, timeout=60)


def test_text_and_json_answers(monitor_url: str) -> None:
    text = httpx.get(monitor_url + "/diagnose", timeout=10)
    assert text.headers["content-type"] == "text/plain; charset=utf-8"
    assert_security_headers(text.headers)
    assert_safe_text(text.text)
    answer = httpx.get(monitor_url + "/diagnose", params={"format": "json"}, timeout=10)
    assert_security_headers(answer.headers)
    assert_exact_json(answer.json()["jobs"])


def test_metrics_escape_label_values(monitor_url: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    metrics = httpx.get(monitor_url + "/metrics", timeout=10)
    assert metrics.status_code == 200
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=metrics.text, capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    jobs = {s.labels["job_id"] for family in text_string_to_metric_families(metrics.text)
            if family.name == "hangwatch_job_verdict" for s in family.samples}
    assert jobs == {JOB, LABEL_JOB}
    # Every sample is one line (the format's lines end at \n only): no label value ended one early.
    odd = [line for line in metrics.text.rstrip("\n").split("\n") if not re.fullmatch(r"(# .*|[a-z_]+(\{.*\})? \S+)", line)]
    assert not odd, odd


@pytest.mark.parametrize("colour", ["never", "always"])
def test_hangwatch_status_and_diagnose_print_no_control_characters(monitor_url: str, colour: str) -> None:
    status = hangwatch("status", "--monitor", monitor_url, "--color", colour)
    assert status.returncode == 1, status  # rank_exited
    shown = OWN_COLOUR.sub("", status.stdout)
    assert UNSAFE.search(shown) is None, shown
    lines = shown.splitlines()
    # The table's header, then one row per job.
    assert len(lines) == 3 and lines[0].split()[:2] == ["JOB", "VERDICT"], lines
    assert any(line.startswith("job<script>alert(1)</script>") for line in lines[1:]), lines
    assert ("\x1b[1;31mRANK_EXITED" in status.stdout) == (colour == "always")

    diagnose = hangwatch("diagnose", "--monitor", monitor_url, "--color", colour)
    assert diagnose.returncode == 1, diagnose
    assert_safe_text(OWN_COLOUR.sub("", diagnose.stdout))

    one = hangwatch("diagnose", "--monitor", monitor_url, "--job", JOB, "--color", colour)
    assert one.returncode == 1 and "JOB job<script>" in one.stdout, one
    assert UNSAFE.search(OWN_COLOUR.sub("", one.stdout)) is None
    # The table cuts a long job id; the report shows it whole, its control characters escaped.
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in one.stdout and "\\u202eevil" in one.stdout, one.stdout
    assert "\\r\\nJOB fake" in one.stdout, one.stdout
    missing = hangwatch("status", "--monitor", monitor_url, "--job", "nope\x1b[2J\u202e")
    assert missing.returncode == 3 and UNSAFE.search(missing.stdout + missing.stderr) is None, missing


def test_hangwatch_diagnose_json_keeps_the_strings(monitor_url: str) -> None:
    res = hangwatch("diagnose", "--monitor", monitor_url, "--json")
    assert res.returncode == 1, res
    assert UNSAFE.search(res.stdout) is None  # JSON escapes them
    assert_exact_json(json.loads(res.stdout)["jobs"])


def test_page_in_a_browser_shows_the_strings_as_text(monitor_url: str, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    page_html = httpx.get(monitor_url + "/", timeout=10)
    assert_security_headers(page_html.headers)
    assert "pwned" not in page_html.text and "alert" not in page_html.text
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                           "--disable-background-networking", "--disable-component-update"])
        try:
            page = browser.new_page()
            dialogs: list[str] = []
            requests: list[str] = []
            failures: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: failures.append(str(e)))
            page.on("console", lambda m: failures.append(m.text) if "Content Security Policy" in m.text else None)
            page.add_init_script("window.__csp = []; document.addEventListener('securitypolicyviolation',"
                                 " (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")
            page.goto(monitor_url + "/", wait_until="load")
            page.wait_for_function("() => document.querySelectorAll('section.job').length === 2", timeout=15_000)
            page.wait_for_function("() => document.querySelectorAll('.history .seg').length > 0", timeout=15_000)
            shown_ids = page.evaluate(
                "Array.from(document.querySelectorAll('section.job h2 > span:nth-child(2)')).map(e => e.textContent)")
            assert sorted(shown_ids) == sorted([JOB, LABEL_JOB])
            frames = page.evaluate("Array.from(document.querySelectorAll('.stack-tree .frame')).map(e => e.textContent)")
            assert any(f.startswith("wait_" + PAYLOAD) for f in frames), frames
            assert page.evaluate("document.querySelectorAll('img, iframe, object, embed').length") == 0
            assert page.evaluate("document.scripts.length") == 2  # dom.js, app.js
            # Style attributes set by app.js apply: the legend's colour, the history bar's widths.
            swatch = page.evaluate("getComputedStyle(document.querySelector('.legend .swatch')).backgroundColor")
            assert swatch not in ("", "rgba(0, 0, 0, 0)"), swatch
            assert page.evaluate("window.__csp") == [] and not failures, (page.evaluate("window.__csp"), failures)
            assert not dialogs
            assert all(r.startswith(monitor_url + "/") for r in requests), requests
            assert not [r for r in requests if r.split("?")[0].endswith("/x")], requests
        finally:
            browser.close()
