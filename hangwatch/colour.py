"""Colour for a person at a terminal, none for a pipe or a script (and never with NO_COLOR): each verdict
in its colour from the verdict catalogue (monitor/diagnosis/verdict_catalogue.py), as on the page and in Grafana."""

from __future__ import annotations

import os
import re
from typing import TextIO

from monitor.diagnosis.verdict_catalogue import BY_NAME, CATALOGUE, COLOURS

_RESET = "\033[0m"
# The monitor's text report writes verdicts in capitals.
_VERDICT_WORDS = re.compile(r"\b(" + "|".join(v.name.upper() for v in CATALOGUE) + r")\b")


def wants_colour(stream: TextIO, choice: str = "auto") -> bool:
    if choice == "always":
        return True
    if choice == "never" or "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    return stream.isatty()


def _code(verdict: str) -> str:
    """The verdict's colour from the verdict catalogue; one the catalogue does not know (a newer
    monitor's) as the worst."""
    entry = BY_NAME.get(verdict.lower())
    return entry.colour.terminal if entry is not None else COLOURS["critical"].terminal


def paint_verdict(text: str, verdict: str, enabled: bool) -> str:
    return f"\033[{_code(verdict)}m{text}{_RESET}" if enabled else text


def paint_verdicts_in(text: str, enabled: bool) -> str:
    """Colour every verdict word written in capitals (the monitor's text report uses them)."""
    if not enabled:
        return text
    return _VERDICT_WORDS.sub(lambda m: paint_verdict(m.group(0), m.group(0), True), text)
