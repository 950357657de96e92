"""Each rank's diagnosed state over the recent past: the status page's per-rank timeline.

The monitor keeps only the newest picture of a rank, but during an incident the order of events
matters (rank 1 went idle, then rank 0 parked in all_reduce). Every diagnosis records each
rank's state here as runs: a new entry only when the state changes, so a rank that stays in one
state for an hour costs one entry. Bounded: runs older than ``window_s`` are dropped (the one
covering the window's start is kept), at most ``max_runs`` per rank, and a job's runs go with it.

Ranks of a healthy job are recorded as ``running`` whatever their activity: a healthy rank
moves between computing, writing and collectives every few seconds, which would be hundreds of
runs per rank (over 100 MB for a 10,000-rank job) that say nothing during an incident. The
timeline starts to tell states apart when the job's raw diagnosis stops being healthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

# What the page draws (its chart's window); the evidence download holds the same.
WINDOW_S = 300.0
MAX_RUNS_PER_RANK = 64
HEALTHY_STATE = "running"


@dataclass(frozen=True)
class StateSpan:
    start: float
    end: float
    state: str


class RankTimeline:
    def __init__(self, window_s: float = WINDOW_S, max_runs: int = MAX_RUNS_PER_RANK) -> None:
        self.window_s = window_s
        self.max_runs = max_runs
        # job -> rank -> [(since, state)], oldest first (lists: a deque costs ~600 bytes a rank)
        self._jobs: dict[str, dict[int, list[tuple[float, str]]]] = {}

    def record(self, job_id: str, at: float, states: Iterable[tuple[int, str]], healthy: bool = False) -> None:
        """The ranks' states as diagnosed at ``at`` (all ``running`` when the job is ``healthy``);
        readings older than a rank's newest are ignored (a report replayed after an outage never
        rewrites what came after it)."""
        ranks = self._jobs.setdefault(job_id, {})
        for rank, state in states:
            if healthy:
                state = HEALTHY_STATE
            runs = ranks.get(rank)
            if runs is None:
                runs = ranks[rank] = []
            elif runs[-1][1] == state or at < runs[-1][0]:
                continue
            runs.append((at, state))
            drop = max(len(runs) - self.max_runs, 0)
            while drop + 1 < len(runs) and runs[drop + 1][0] <= at - self.window_s:
                drop += 1
            if drop:
                del runs[:drop]

    def spans(self, job_id: str, now: float, ranks: Iterable[int] | None = None) -> dict[int, list[StateSpan]]:
        """Per rank (ascending; only ``ranks`` when given), its states within ``[now - window_s,
        now]``, oldest first; the newest state lasts until ``now``."""
        start = now - self.window_s
        kept = self._jobs.get(job_id, {})
        wanted = sorted(kept) if ranks is None else sorted(r for r in set(ranks) if r in kept)
        return {rank: list(_clipped(kept[rank], start, now)) for rank in wanted}

    def runs(self, job_id: str, ranks: Iterable[int] | None = None) -> dict[int, tuple[tuple[float, str], ...]]:
        """A copy of the runs of the job's ranks (ascending; only ``ranks`` when given): cheap enough to
        take under the monitor's lock, to be clipped (``clipped_spans``) outside it."""
        kept = self._jobs.get(job_id, {})
        wanted = sorted(kept) if ranks is None else sorted(r for r in set(ranks) if r in kept)
        return {rank: tuple(kept[rank]) for rank in wanted}

    def clipped(self, runs: dict[int, tuple[tuple[float, str], ...]],
                now: float) -> tuple[tuple[int, tuple[tuple[float, float, str], ...]], ...]:
        """``runs`` (a copy from ``runs()``) as spans within the window ending at ``now``; reads no
        kept state, so it needs no lock."""
        return clipped_spans(runs, now - self.window_s, now)

    def ranks(self, job_id: str) -> list[int]:
        return sorted(self._jobs.get(job_id, {}))

    def forget(self, live_jobs: Iterable[str]) -> None:
        live = set(live_jobs)
        for job_id in [j for j in self._jobs if j not in live]:
            del self._jobs[job_id]


def clipped_spans(runs: dict[int, tuple[tuple[float, str], ...]], start: float,
                  now: float) -> tuple[tuple[int, tuple[tuple[float, float, str], ...]], ...]:
    """Per rank (in the order given), its ``(start, end, state)`` spans within ``[start, now]``,
    oldest first; the newest state lasts until ``now``."""
    return tuple((rank, tuple((s.start, s.end, s.state) for s in _clipped(entries, start, now)))
                 for rank, entries in runs.items())


def _clipped(runs: Sequence[tuple[float, str]], start: float, now: float) -> Iterator[StateSpan]:
    for i, (since, state) in enumerate(runs):
        until = runs[i + 1][0] if i + 1 < len(runs) else now
        if until > start and since <= now:
            yield StateSpan(max(since, start), min(until, now), state)
