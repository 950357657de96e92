"""Each rank's diagnosed state over the recent past: the status page's per-rank timeline.

The monitor keeps only the newest picture of a rank, but during an incident the order of events
matters (rank 1 went idle, then rank 0 parked in all_reduce). Every diagnosis records each
rank's state here as runs: a new entry only when the state changes, so a rank that stays in one
state for an hour costs one entry. Bounded: runs older than ``window_s`` are dropped (the one
covering the window's start is kept), at most ``max_runs`` per rank, and a job's runs go with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

WINDOW_S = 900.0
MAX_RUNS_PER_RANK = 240


@dataclass(frozen=True)
class StateSpan:
    start: float
    end: float
    state: str


class RankTimeline:
    def __init__(self, window_s: float = WINDOW_S, max_runs: int = MAX_RUNS_PER_RANK) -> None:
        self.window_s = window_s
        self.max_runs = max_runs
        # job -> rank -> (since, state), oldest first
        self._jobs: dict[str, dict[int, deque[tuple[float, str]]]] = {}

    def record(self, job_id: str, at: float, states: Iterable[tuple[int, str]]) -> None:
        """The ranks' states as diagnosed at ``at``; readings older than a rank's newest are ignored
        (a report replayed after an outage never rewrites what came after it)."""
        ranks = self._jobs.setdefault(job_id, {})
        for rank, state in states:
            runs = ranks.get(rank)
            if runs is None:
                runs = ranks[rank] = deque(maxlen=self.max_runs)
            elif runs[-1][1] == state or at < runs[-1][0]:
                continue
            runs.append((at, state))
            while len(runs) >= 2 and runs[1][0] <= at - self.window_s:
                runs.popleft()

    def spans(self, job_id: str, now: float) -> dict[int, list[StateSpan]]:
        """Per rank (ascending), its states within ``[now - window_s, now]``, oldest first; the
        newest state lasts until ``now``."""
        start = now - self.window_s
        return {rank: list(_clipped(runs, start, now)) for rank, runs in sorted(self._jobs.get(job_id, {}).items())}

    def forget(self, live_jobs: Iterable[str]) -> None:
        live = set(live_jobs)
        for job_id in [j for j in self._jobs if j not in live]:
            del self._jobs[job_id]


def _clipped(runs: deque[tuple[float, str]], start: float, now: float) -> Iterator[StateSpan]:
    entries = list(runs)
    for i, (since, state) in enumerate(entries):
        until = entries[i + 1][0] if i + 1 < len(entries) else now
        if until > start and since <= now:
            yield StateSpan(max(since, start), min(until, now), state)
