"""GET /runbook: docs/runbook.md as the monitor's own page, the one the status page and the alerts link
to. The renderer on strings (every character escaped, headings anchored as GitHub does, links kept on
the page or on the web), then a real monitor with a read token, which serves the page open."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from real_monitor import RunningMonitor, running_monitor

from monitor.web.page_links import RUNBOOK_SECTIONS
from monitor.web.runbook import SOURCE, anchor, render_runbook

ROOT = Path(__file__).resolve().parents[2]
READER = "runbook-reader-token-0123456789"
ALERT_RULES = ROOT / "dashboards" / "hangwatch-alerts.yml"


def _body(page: str) -> str:
    return page.split("<main>", 1)[1].split("</main>", 1)[0]


@pytest.mark.parametrize(("markdown", "present", "absent"), [
    ("## Rank exited", ['<h2 id="rank-exited">Rank exited</h2>'], []),
    ("## Acting on verdicts\n\n### What hangs cost", ['id="acting-on-verdicts"', '<h3 id="what-hangs-cost">'], []),
    ("## `HANGWATCH_MAX_JOBS`, jobs & ranks!", ['id="hangwatch_max_jobs-jobs--ranks"'], []),
    ("## Same\n\n## Same", ['id="same"', 'id="same-1"'], []),
    # Raw HTML is text: in a heading, a paragraph, a code span, a code block, a table cell.
    ("## A <script>alert(1)</script>", ["A &lt;script&gt;alert(1)&lt;/script&gt;</h2>"], ["<script"]),
    ("<script>alert(1)</script>\n\n<img src=x onerror=alert(1)>",
     ["&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt;"], ["<script", "<img"]),
    ("`<b>` & \"q\"", ["<code>&lt;b&gt;</code> &amp; &quot;q&quot;"], ["<b>"]),
    ("```sh\ncurl -s 'http://M/diagnose?a=1&b=<2>'\n```",
     ['<pre><code class="language-sh">curl -s \'http://M/diagnose?a=1&amp;b=&lt;2&gt;\'\n</code></pre>'], []),
    ("| a | b |\n|---|---|\n| `{job}` | <i>x</i> |",
     ["<table>", "<th>a</th>", "<td><code>{job}</code></td>", "<td>&lt;i&gt;x&lt;/i&gt;</td>"], ["<i>"]),
    ("- one\n- two `x`\n\n1. first", ["<ul>\n<li>one</li>\n<li>two <code>x</code></li>", "<ol>\n<li>first</li>"], []),
    # Links: on the page, or to the web (opened without a referrer); another file of docs/ keeps its text only.
    ("see [Collector failing](#collector-failing)", ['<a href="#collector-failing">Collector failing</a>'], []),
    ("[the docs](https://example.org/a?b=1&c=2)",
     ['<a href="https://example.org/a?b=1&amp;c=2" rel="noopener noreferrer">the docs</a>'], []),
    ("listed in [failures.md](failures.md).", ["listed in failures.md.</p>"], ["<a "]),
    ("[x](javascript:alert(1)) [y](data:text/html,hi) [z](//evil.example/)", [], ['href="javascript', 'href="data',
                                                                             'href="//']),
    ("![logo](https://example.org/logo.png)", [], ["<img"]),  # the page loads nothing from elsewhere
])
def test_the_renderer_escapes_everything_and_anchors_headings(markdown: str, present: list[str],
                                                             absent: list[str]) -> None:
    body = _body(render_runbook(markdown))
    for fragment in present:
        assert fragment in body, body
    for fragment in absent:
        assert fragment not in body, body


def test_the_page_lists_the_sections_and_loads_only_its_stylesheet() -> None:
    page = render_runbook("# Runbook: <x>\n\n## Deadlock\n\ntext\n\n### Detail\n\n## Agent silent\n")
    assert "<title>Runbook: &lt;x&gt;</title>" in page
    nav = page.split("<nav", 1)[1].split("</nav>", 1)[0]
    assert re.findall(r'href="([^"]+)"', nav) == ["#deadlock", "#agent-silent"]
    assert re.findall(r'<link [^>]*href="([^"]+)"', page) == ["data:,", "/static/runbook.css"]
    assert "<script" not in page and "<style" not in page and " style=" not in page


def test_anchors_are_githubs_for_every_heading_of_the_runbook() -> None:
    """The rule the other tests of the runbook's sections use (lower case, punctuation dropped)."""
    headings = re.findall(r"^#{1,6} (.+)$", SOURCE.read_text(), re.MULTILINE)
    assert headings
    for heading in headings:
        assert anchor(heading) == re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-"), heading


def _alert_anchors() -> set[str]:
    rules = [r for g in yaml.safe_load(ALERT_RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    return {r["annotations"]["runbook_url"].rsplit("#", 1)[1] for r in rules}


# --- the real monitor ---

@pytest.fixture(scope="module")
def monitor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMonitor]:
    """A monitor whose reads need a token: the runbook is open all the same."""
    workdir = tmp_path_factory.mktemp("runbook")
    readers = workdir / "read.token"
    readers.write_text(READER + "\n")
    readers.chmod(0o600)
    with running_monitor(workdir, "--read-token-file", str(readers)) as running:
        yield running


@pytest.mark.live
def test_the_monitor_serves_every_section_the_page_and_the_alerts_link_to(monitor: RunningMonitor) -> None:
    answer = httpx.get(monitor.base + "/runbook", timeout=10)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    ids = set(re.findall(r'<h[1-6] id="([^"]+)"', answer.text))
    wanted = set(RUNBOOK_SECTIONS.values()) | _alert_anchors()
    assert len(wanted) >= 15 and wanted <= ids, wanted - ids
    # The same text as docs/runbook.md: the package's copy is current.
    assert SOURCE.read_text() == (ROOT / "docs" / "runbook.md").read_text()
    # Revalidated by ETag, like the page's other files.
    again = httpx.get(monitor.base + "/runbook", headers={"if-none-match": answer.headers["etag"]}, timeout=10)
    assert again.status_code == 304


@pytest.mark.live
def test_the_runbook_and_its_stylesheet_need_no_token_while_the_page_does(monitor: RunningMonitor) -> None:
    assert httpx.get(monitor.base + "/", timeout=10).status_code == 401
    assert httpx.get(monitor.base + "/static/style.css", timeout=10).status_code == 401
    style = httpx.get(monitor.base + "/static/runbook.css", timeout=10)
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert not re.search(r"https?://|@import|url\(", style.text)
    page = httpx.get(monitor.base + "/runbook", timeout=10).text
    # Nothing on the page the Content-Security-Policy would block: no script, no inline style, every
    # resource from this monitor.
    assert "<script" not in page and "<style" not in page
    resources = re.findall(r'<(?:link|img)\b[^>]*(?:href|src)="([^"]+)"', page)
    assert resources == ["data:,", "/static/runbook.css"], resources
    # Its links stay on the page or on the status page, or go to the web.
    assert all(re.match(r"#|/$|https?://", href) for href in re.findall(r'<a href="([^"]+)"', page))
