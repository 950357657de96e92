"""When a node that owes a full report sends it: a restarted monitor's herd spread over seconds.

After a restart every agent's next report is a delta on a picture this process does not hold,
and the answer asks for a full report (``send_full``). Asked all at once, the 1,250 nodes of a
10,000-rank job would send theirs in the same second, each several times a delta's size and
cost, while the monitor is busiest. Instead each node that owes one gets a slot in a window
sized by how many owe one (``FULL_REPORTS_PER_S``), ``MAX_WAIT_S`` at most, and the answer
says how far off it is (``"full_in_s"``). Until then the node's agent goes on sending deltas;
the monitor reads such a node as not the present (monitor/ingest/tracks.is_fresh: ``partial``),
so its jobs are ``unknown`` (refreshing), never judged from a half-built picture.

A node's slot is a fixed fraction of the window (a hash of its name): a retried post gets the
same one. The window opens ``LEAD_S`` after the herd's first ask (an agent's interval: every node
of the herd asks once before the first slot; slots that passed before a node's first ask would
all be taken at its next report, bunched) and only grows while the herd lasts, sized by the
nodes that asked or, when more, the nodes known to owe one (those restored from the store:
``expected``), so it is right from the first answer after a restart. A herd that a second of the
target rate covers is not paced at all (each node's full report at its next report), nor is one
node owing a full report alone (a forgotten node).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

# Full reports a second that a herd is spread to. A herd of at most this many nodes is not paced: its
# full reports come at each node's next report, within a second, which the monitor took at 10,000
# ranks (1,250 nodes, up to 1,021 full reports a second) sooner than it took paced ones (the nodes'
# deltas meanwhile cost more than the spread saved: benchmarks/README.md, "Restart under a giant job").
FULL_REPORTS_PER_S = 1500.0
# No node waits longer than this for its slot, whatever the herd: the job's verdict is
# unknown until its last node's full report, and must be right again within ~15 s.
MAX_WAIT_S = 10.0
# A node that has not asked for this long left the herd (its agent stopped, or the node was
# forgotten): it no longer holds the herd open.
FORGET_AFTER_S = 30.0
# The window opens this long after the herd's first ask: an agent's report interval.
LEAD_S = 1.0
# How often the nodes that left are swept out (a pass over the owing nodes).
SWEEP_EVERY_S = 1.0


def slot_fraction(node: str) -> float:
    """Where in the window ``node``'s slot falls, in [0, 1): the same in every process."""
    return zlib.crc32(node.encode()) / 2**32


@dataclass
class FullReportPacer:
    """The nodes owing a full report and the herd's window. Not thread-safe: the caller's lock."""

    per_s: float = FULL_REPORTS_PER_S
    max_wait_s: float = MAX_WAIT_S
    # node -> when it last asked (sent a delta this process cannot build on).
    _asked: dict[str, float] = field(default_factory=dict)
    _herd_started_at: float = 0.0
    _window_s: float = 0.0
    _swept_at: float = 0.0

    def wait_s(self, node: str, now: float, expected: int = 0) -> float:
        """Seconds from ``now`` until ``node``, which owes a full report, should send it (0: now).
        ``expected``: the nodes known to owe one, asked or not yet (restored after a restart)."""
        self._sweep(now)
        if not self._asked:
            self._herd_started_at, self._window_s = now, 0.0
        self._asked[node] = now
        owing = max(len(self._asked), expected)
        if owing > self.per_s:
            self._window_s = min(self.max_wait_s, max(self._window_s, owing / self.per_s))
        window = self._window_s
        due = self._herd_started_at + min(LEAD_S, window) + slot_fraction(node) * window
        return round(max(0.0, due - now), 3)

    def paid(self, node: str) -> None:
        """``node``'s full report arrived."""
        self._asked.pop(node, None)

    @property
    def owing(self) -> int:
        return len(self._asked)

    def _sweep(self, now: float) -> None:
        if now - self._swept_at < SWEEP_EVERY_S:
            return
        self._swept_at = now
        for node in [n for n, at in self._asked.items() if now - at > FORGET_AFTER_S]:
            del self._asked[node]
