"""Strings from monitored processes, made safe to write to a terminal.

Job ids, command lines, log lines and stack frames come from the processes the agents watch.
Written raw to a terminal, an ESC starts an escape sequence (clear the screen, set the window
title), a CR rewrites the line, a bidi override makes it read other than it is. Each such
character is written as its escape (``\\x1b``, ``\\u202e``), so the reader sees something was there.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, the bidi marks, embeddings, overrides and isolates, the
# Unicode line and paragraph separators, and lone surrogates (which cannot be encoded).
_UNSAFE = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_IN_LINE = re.compile(rf"[\t\n{_UNSAFE}]")
_IN_BLOCK = re.compile(rf"[{_UNSAFE}]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def one_line(text: str) -> str:
    """``text`` as one line: every control character escaped, newline and tab too."""
    return _IN_LINE.sub(_escape, text)


def text_block(text: str) -> str:
    """``text`` with its lines and tabs kept, every other control character escaped."""
    return _IN_BLOCK.sub(_escape, text)
