"""Strings from monitored processes are shown, never obeyed: terminal text, JSON, page headers.

A job id, command line, log line or frame name may hold terminal escapes (clear the screen, set
the window title), a CR or newline that fakes a line, a bidi override, or HTML. The text report
escapes them (hangwatch_common/safe_text.py); JSON keeps them exactly; the page is served with headers
that let only its own script and style run. The real server, the CLI, /metrics and a browser:
test_output_safety_live.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from monitor_reports import frame, launcher, orphan, rank, report, stack
from monitor_testkit import FakeClock, TestClient

from monitor.web.app import create_app
from monitor.web.routes.page import STATIC_DIR
from hangwatch_common.safe_text import one_line, text_block
from monitor.web.security_headers import CONTENT_SECURITY_POLICY, SecurityHeaders
from monitor.web.settings import Settings
from monitor.storage.store import Store

HTML = '<script>alert(1)</script>"><img src=x onerror=alert(1)>'
ANSI = "\x1b[2J\x1b]0;pwned\x07"
LABEL = 'a"b\\c\nd{e="f"}'
BIDI = "\u202eevil\u202c"
C1 = "\x9b31m\x85"
FAKE_LINE = "\r\nJOB fake  HEALTHY"
PAYLOAD = HTML + ANSI + LABEL + BIDI + C1 + FAKE_LINE
JOB = "job" + PAYLOAD
# A job id that breaks a Prometheus label written without escapes.
LABEL_JOB = LABEL
# Written independently of hangwatch_common/safe_text.py: what must never reach a terminal.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
# What the escaped payload shows instead.
SHOWN = ["\\x1b[2J", "\\x1b]0;pwned\\x07", "\\u202eevil\\u202c", "\\x9b31m\\x85", "\\r\\nJOB fake  HEALTHY",
         'a"b\\c\\nd{e="f"}', HTML]


def payload_report(now: float) -> dict[str, Any]:
    """One node's report with the payload in every string a person gets to read."""
    frames = [frame("wait_" + PAYLOAD, "/work/" + PAYLOAD + ".py", 3), frame("main", "/work/train.py", 9)]
    main_stack = stack(now, frames=frames)
    main_stack["threads"][0]["name"] = PAYLOAD
    alive = rank(job_id=JOB, rank=0, cmdline="python " + PAYLOAD, stack=main_stack, env={"MASTER_ADDR": PAYLOAD},
                 identified_by="env:" + PAYLOAD, log_errors=["NCCL WARN " + PAYLOAD])
    ended = rank(job_id=JOB, rank=1, alive=False, stack=stack(now, frames=frames),
                 log_errors=["RuntimeError: " + PAYLOAD])
    return report(ranks=[alive, ended, rank(job_id=LABEL_JOB, rank=0, world_size=1)], sent_at=now,
                  launchers=[launcher(job_id=JOB, cmdline="torchrun " + PAYLOAD, stack=stack(now, frames=frames))],
                  orphans=[orphan(77, "python " + PAYLOAD, [29500])])


def assert_safe_text(text: str) -> None:
    """No control character, and no line the payload made up; its escaped form shows instead."""
    found = UNSAFE.search(text)
    assert found is None, f"{found.group()!r} at {found.start()}: {text[max(0, found.start() - 60):found.end() + 20]!r}"
    assert not [line for line in text.splitlines() if line.lstrip().startswith("JOB fake")], text
    for shown in SHOWN:
        assert shown in text, (shown, text)


def assert_exact_json(jobs: list[dict[str, Any]]) -> None:
    """JSON escapes by construction: every string comes back exactly as reported."""
    by_id = {j["job_id"]: j for j in jobs}
    assert set(by_id) == {JOB, LABEL_JOB}
    job = by_id[JOB]
    assert job["orphans"][0]["cmdline"] == "python " + PAYLOAD
    assert job["stack_groups"][0]["frames"][0].startswith(f"wait_{PAYLOAD} (")
    assert any("RuntimeError: " + PAYLOAD in e for e in job["evidence"]), job["evidence"]
    assert {r["identified_by"] for r in job["ranks"]} >= {"env:" + PAYLOAD}


# ---------------------------------------------------------------- safe_text, one row per character


@pytest.mark.parametrize(("raw", "line", "block"), [
    ("plain text", "plain text", "plain text"),
    ("utf-8 é 日本 ← 🙂 👩‍💻", "utf-8 é 日本 ← 🙂 👩‍💻", "utf-8 é 日本 ← 🙂 👩‍💻"),  # ZWJ (U+200D) kept
    ("a\x1b[2Jb", "a\\x1b[2Jb", "a\\x1b[2Jb"),
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07", "\\x1b]0;pwned\\x07"),
    ("nul\x00", "nul\\x00", "nul\\x00"),
    ("bs\x08", "bs\\x08", "bs\\x08"),
    ("x\ny", "x\\ny", "x\ny"),
    ("x\ty", "x\\ty", "x\ty"),
    ("x\ry", "x\\ry", "x\\ry"),
    ("vt\x0bff\x0cfs\x1cus\x1f", "vt\\x0bff\\x0cfs\\x1cus\\x1f", "vt\\x0bff\\x0cfs\\x1cus\\x1f"),
    ("del\x7f", "del\\x7f", "del\\x7f"),
    ("c1\x80\x85\x9b\x9f", "c1\\x80\\x85\\x9b\\x9f", "c1\\x80\\x85\\x9b\\x9f"),
    ("\u00a0nbsp", "\u00a0nbsp", "\u00a0nbsp"),  # printable: the first past C1
    ("\u202eevil\u202c", "\\u202eevil\\u202c", "\\u202eevil\\u202c"),
    ("\u202a\u202b\u202d", "\\u202a\\u202b\\u202d", "\\u202a\\u202b\\u202d"),
    ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069", "\\u2066\\u2067\\u2068\\u2069"),
    ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c", "\\u200e\\u200f\\u061c"),
    ("ls\u2028ps\u2029", "ls\\u2028ps\\u2029", "ls\\u2028ps\\u2029"),  # line breaks to str.splitlines
    ("lone\ud800", "lone\\ud800", "lone\\ud800"),  # would not encode as UTF-8
    ("C:\\x1b", "C:\\x1b", "C:\\x1b"),  # a backslash is printable: left as it is
])
def test_escapes_control_and_bidi_characters(raw: str, line: str, block: str) -> None:
    assert one_line(raw) == line
    assert text_block(raw) == block
    assert UNSAFE.search(one_line(raw)) is None and UNSAFE.search(text_block(raw)) is None
    assert text_block(one_line(raw)) == one_line(raw)  # escaping twice changes nothing more


def test_every_unsafe_code_point_is_escaped() -> None:
    every = "".join(map(chr, range(0x10000)))
    assert UNSAFE.search(one_line(every)) is None
    assert UNSAFE.search(text_block(every).replace("\n", "").replace("\t", "")) is None
    assert "\n" not in one_line(every) and "\t" not in one_line(every)


# ---------------------------------------------------------------- the text report through the app


def test_text_report_escapes_the_payload_and_json_keeps_it(client: TestClient, clock: FakeClock) -> None:
    assert client.post("/api/v1/reports", json=payload_report(clock.now)).status_code == 202
    clock.advance(30)
    full = client.get("/diagnose")
    assert full.headers["content-type"] == "text/plain; charset=utf-8"
    assert_safe_text(full.text)
    assert f"JOB job{HTML}\\x1b[2J" in full.text
    assert "leftover processes" in full.text and "stacks (innermost first)" in full.text
    summary = client.get("/diagnose", params={"view": "summary"}).text
    assert UNSAFE.search(summary) is None and summary.count("\n") == 2, summary
    one = client.get("/diagnose", params={"job": JOB}).text
    assert_safe_text(one)
    missing = client.get("/diagnose", params={"job": "nope" + ANSI + BIDI}).text
    assert UNSAFE.search(missing) is None and missing.startswith("hangwatch: no job"), missing
    assert_exact_json(client.get("/diagnose", params={"format": "json"}).json()["jobs"])
    history = client.get(f"/api/v1/jobs/{quote(LABEL_JOB, safe='')}/history").json()
    assert history["job_id"] == LABEL_JOB


# ---------------------------------------------------------------- security headers


@pytest.fixture
def guarded(settings: Settings, store: Store, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings, store, clock=clock)) as client:
        yield client


def assert_security_headers(headers: Any) -> None:
    assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"
    assert len(headers.get_list("content-security-policy")) == 1


def test_every_answer_has_the_security_headers(guarded: TestClient, clock: FakeClock) -> None:
    posted = guarded.post("/api/v1/reports", json=payload_report(clock.now))
    assert posted.status_code == 202
    assert_security_headers(posted.headers)
    for url in ["/", "/static/app.js", "/static/style.css", "/diagnose", "/diagnose?format=json",
                "/diagnose?view=summary", f"/api/v1/jobs/{quote(LABEL_JOB, safe='')}/history", "/metrics", "/healthz"]:
        response = guarded.get(url)
        assert response.status_code == 200, url
        assert_security_headers(response.headers)
    for response in [guarded.get("/static/nope.js"), guarded.get("/nope"), guarded.get("/diagnose?limit=0"),
                     guarded.post("/api/v1/reports", content=b"{", headers={"content-type": "application/json"}),
                     guarded.get("/", headers={"if-none-match": guarded.get("/").headers["etag"]})]:
        assert response.status_code in (304, 404, 422), response
        assert_security_headers(response.headers)


def test_the_page_itself_holds_no_reported_string(guarded: TestClient, clock: FakeClock) -> None:
    guarded.post("/api/v1/reports", json=payload_report(clock.now))
    html = guarded.get("/").text
    assert "pwned" not in html and "alert" not in html and "evil" not in html
    assert html.encode() == (STATIC_DIR / "index.html").read_bytes()


def test_headers_a_route_sets_itself_are_kept_and_other_scopes_pass() -> None:
    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"X-Frame-Options", b"SAMEORIGIN"), (b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"ok"})
        else:
            await send({"type": scope["type"] + ".seen"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    app = SecurityHeaders(inner)
    asyncio.run(app({"type": "http"}, None, send))
    headers = sent[0]["headers"]
    assert [v for k, v in headers if k.lower() == b"x-frame-options"] == [b"SAMEORIGIN"]
    assert (b"x-content-type-options", b"nosniff") in headers and sent[1]["body"] == b"ok"
    asyncio.run(app({"type": "lifespan"}, None, send))
    assert sent[2] == {"type": "lifespan.seen"}


def test_page_files_run_under_the_policy() -> None:
    """No inline script, style element or event handler; style attributes only from constants."""
    html = (STATIC_DIR / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/static/dom.js">', '<script src="/static/app.js">']
    assert "<style" not in html and not re.search(r"\s(on\w+|style)\s*=", html)
    assert not re.search(r"(src|href)\s*=\s*\"(?!/|data:,\"|#)", html)
    js = (STATIC_DIR / "dom.js").read_text() + (STATIC_DIR / "app.js").read_text()
    for sink in ("innerHTML =", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setTimeout(\"", "javascript:"):
        assert sink not in js, sink
    # 'unsafe-inline' for style attributes is safe only while no reported string goes into one.
    assert re.findall(r"style: `([^`]*)`", js) == ["background: ${color}",
                                                   "flex-grow: ${Math.max(0, until - c.at).toFixed(3)}",
                                                   "flex-grow: ${(s - at).toFixed(3)}",
                                                   "flex-grow: ${(e - s).toFixed(3)}",
                                                   "padding-left: ${(1.1 * row.indent).toFixed(1)}em"]
    assert "color = LINE_COLORS[" in js
