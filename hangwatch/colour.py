"""Colour for a person at a terminal, none for a pipe or a script (and never with NO_COLOR)."""

from __future__ import annotations

import os
import re
from typing import TextIO

GOOD = frozenset({"healthy", "finished"})
WARN = frozenset({"straggler", "slow_compute", "stalled"})
_CODES = {"good": "32", "warn": "33", "bad": "1;31"}
_RESET = "\033[0m"
_VERDICT_WORDS = re.compile(
    r"\b(HEALTHY|FINISHED|DEADLOCK|STRAGGLER|SLOW_COMPUTE|RANK_EXITED|RANK_STOPPED|RENDEZVOUS_HANG|STALLED)\b"
)


def wants_colour(stream: TextIO, choice: str = "auto") -> bool:
    if choice == "always":
        return True
    if choice == "never" or "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    return stream.isatty()


def _tone(verdict: str) -> str:
    word = verdict.lower()
    return "good" if word in GOOD else "warn" if word in WARN else "bad"


def paint_verdict(text: str, verdict: str, enabled: bool) -> str:
    return f"\033[{_CODES[_tone(verdict)]}m{text}{_RESET}" if enabled else text


def paint_verdicts_in(text: str, enabled: bool) -> str:
    """Colour every verdict word written in capitals (the monitor's text report uses them)."""
    if not enabled:
        return text
    return _VERDICT_WORDS.sub(lambda m: paint_verdict(m.group(0), m.group(0), True), text)
