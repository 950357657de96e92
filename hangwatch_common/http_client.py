"""httpx, imported without its command-line tool: ``from hangwatch_common.http_client import httpx``.

httpx's package imports its own CLI (``httpx._main``, which pulls in click, rich and pygments)
whenever those are installed, and rich is, beside hangwatch (it draws ``hangwatch status``). No
hangwatch process runs httpx's CLI, and importing it was a third of the agent's start: ~0.15 s of
CPU on every node at every start and in every ``--once`` run, and as much in each relay. A ``None``
in ``sys.modules`` makes that one import fail as it would without them, which httpx expects: its
``httpx.main`` is then a stub that says to install ``httpx[cli]``.

Where httpx is already imported (a program that wanted its CLI), this changes nothing.
"""

from __future__ import annotations

import sys

if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]

import httpx  # noqa: E402

__all__ = ["httpx"]
