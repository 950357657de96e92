"""Overload protection: how far behind the event loop runs, and which reports to shed.

Everything the monitor does runs on one event loop, so the loop's lag (how late a timer
fires) is the one measure of being past capacity: it is what every request waits on top of
its own work. While the lag stays above ``shed_lag_s``, a report from a node the monitor
heard from within ``shed_keep_s`` is refused with 503 and ``Retry-After``: the agent sends
its newest report a little later (latest report per node wins), every node's picture stays
at most a few seconds old, and the diagnosis keeps its share of the loop. A node not heard
from for ``shed_keep_s`` always gets in, so no node goes dark.
"""

from __future__ import annotations

import asyncio
import bisect
import re
import time
from collections import deque
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from hangwatch_common.settings import setting

# The agent writes "node" among the first keys; the shed decision reads it without decoding.
_NODE_FIELD = re.compile(rb'"node"\s*:\s*"([A-Za-z0-9_.:\-]{1,128})"')
NODE_PEEK_BYTES = 512
PROBE_EVERY_S = 0.05
LAG_WINDOW_S = 1.0
SHED_WINDOW_S = 60.0
# Upper bounds of the probes' lateness histogram (seconds): its p99 over a window is the loop's
# lag p99, which the gauge of the last second's worst cannot give between scrapes.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def peek_node(body: bytes) -> str | None:
    """The report's node name if it is near the start of the body; None otherwise."""
    match = _NODE_FIELD.search(body, 0, NODE_PEEK_BYTES)
    return match.group(1).decode() if match else None


@dataclass(frozen=True)
class ShedSettings:
    """The monitor's settings of these names (monitor/web/settings.py inherits them), declared here."""

    # The newest report per node wins, every node's picture stays fresh within a few seconds, diagnosis goes on.
    shed_lag_s: float = setting(0.5, help="when the event loop runs this far behind, reports from nodes heard from "
                                "within the shed-keep time are refused with 503 and Retry-After", positive=True)
    shed_keep_s: float = setting(5.0, help="seconds within which a node heard from may have a report shed",
                                 positive=True)


@dataclass
class LoadGuard:
    shed_lag_s: float = ShedSettings.shed_lag_s
    shed_keep_s: float = ShedSettings.shed_keep_s
    lag_s: float = 0.0
    shed_total: int = 0
    _lags: deque[tuple[float, float]] = field(default_factory=deque)
    _sheds: deque[float] = field(default_factory=deque)
    _accepted_at: dict[str, float] = field(default_factory=dict)
    # Probes per bucket of LAG_BUCKETS (not cumulative; the last is past the largest bound).
    lag_counts: list[int] = field(default_factory=lambda: [0] * (len(LAG_BUCKETS) + 1))
    lag_sum_s: float = 0.0

    def note_lag(self, lag: float, now: float) -> None:
        """One probe's lateness; ``lag_s`` is the largest over the last second."""
        self.lag_counts[bisect.bisect_left(LAG_BUCKETS, lag)] += 1
        self.lag_sum_s += lag
        self._lags.append((now, lag))
        while self._lags and self._lags[0][0] < now - LAG_WINDOW_S:
            self._lags.popleft()
        self.lag_s = max(v for _, v in self._lags)

    @property
    def overloaded(self) -> bool:
        return self.lag_s > self.shed_lag_s

    def should_shed(self, node: str | None, now: float) -> bool:
        if node is None or not self.overloaded:
            return False
        last = self._accepted_at.get(node)
        if last is None or now - last >= self.shed_keep_s:
            return False
        self.shed_total += 1
        self._sheds.append(now)
        return True

    def accepted(self, node: str, now: float) -> None:
        self._accepted_at[node] = now

    def forget(self, nodes: AbstractSet[str]) -> None:
        for node in set(self._accepted_at) - nodes:
            del self._accepted_at[node]

    def shed_recently(self, now: float) -> int:
        while self._sheds and self._sheds[0] < now - SHED_WINDOW_S:
            self._sheds.popleft()
        return len(self._sheds)

    async def watch_loop(self) -> None:
        """Measure the event loop's lag forever (run as a task on the loop it measures)."""
        while True:
            started = time.monotonic()
            await asyncio.sleep(PROBE_EVERY_S)
            now = time.monotonic()
            self.note_lag(max(0.0, now - started - PROBE_EVERY_S), now)
