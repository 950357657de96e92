"""The runbook (docs/runbook.md) as the monitor's own page, ``GET /runbook``: the alerts and the status
page link each verdict to its section there, so the links work with nothing else to host (issue 36).

The text ships in the package as ``runbook.md`` beside this module, a copy of docs/runbook.md that
scripts/build-mixin.py writes (its ``--check`` fails on a copy that differs). It is CommonMark plus
tables, rendered by markdown-it-py (rich's own dependency) with raw HTML off, so every character of
the text comes out escaped. Each heading gets the anchor GitHub gives it (``## Rank exited`` is
``#rank-exited``): the sections the verdict catalogue names. Links stay on the page (``#section``)
or go to an http(s) address; one to another file of docs/, which the monitor does not serve, keeps
its text only. The page loads nothing but its stylesheet, as the Content-Security-Policy wants.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

# Where the monitor serves it, and its stylesheet (monitor/web/static/); both open without a token
# (monitor/web/auth.py says why).
RUNBOOK_PATH = "/runbook"
STYLE_PATH = "/static/runbook.css"
SOURCE = Path(__file__).resolve().with_name("runbook.md")

PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="{style}">
</head>
<body>
  <header><a href="/">hangwatch</a> <span>runbook</span></header>
  <nav aria-label="sections"><ul>
{contents}
  </ul></nav>
  <main>
{body}  </main>
</body>
</html>
"""


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def render_runbook(markdown: str) -> str:
    """The whole page for the runbook's markdown: headings anchored, sections listed at the top."""
    # Imported here: a tenth of a second that only the first reader of the page pays, not every start.
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark", {"html": False}).enable("table").disable("image")
    parser.core.ruler.push("heading_anchors", _anchor_headings)
    parser.core.ruler.push("safe_links", _keep_safe_links)
    env: dict[str, Any] = {}
    body = parser.render(markdown, env)
    sections = env.get("sections", [])
    title = next((text for level, _, text in sections if level == 1), "Runbook")
    contents = "\n".join(f'    <li><a href="#{slug}">{html.escape(text)}</a></li>'
                         for level, slug, text in sections if level == 2)
    return PAGE.format(title=html.escape(title), style=STYLE_PATH, contents=contents, body=body)


def _plain_text(inline: Any) -> str:
    return "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))


def _anchor_headings(state: Any) -> None:
    seen: dict[str, int] = {}
    sections = state.env.setdefault("sections", [])
    for heading, inline in zip(state.tokens, state.tokens[1:]):
        if heading.type != "heading_open":
            continue
        text = _plain_text(inline)
        slug = anchor(text)
        # A second heading of the same text gets "-1", as on GitHub.
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slug = f"{slug}-{count}" if count else slug
        heading.attrSet("id", slug)
        sections.append((int(heading.tag[1]), slug, text))


def _keep_safe_links(state: Any) -> None:
    for token in state.tokens:
        if token.type != "inline" or not token.children:
            continue
        kept, dropping = [], False
        for child in token.children:
            if child.type == "link_open":
                href = str(child.attrGet("href") or "")
                if href.startswith("#"):
                    pass
                elif href.lower().startswith(("http://", "https://")):
                    child.attrSet("rel", "noopener noreferrer")
                else:
                    dropping = True  # another file of docs/: its text, no link
                    continue
            elif child.type == "link_close" and dropping:
                dropping = False
                continue
            kept.append(child)
        token.children = kept
