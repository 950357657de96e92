"""A job's progress chart as lines people can read: ranks that progress alike share one line.

Ranks of a synchronous job log the same steps a few milliseconds apart, so their points never
match exactly (a 2,000-rank job drew 32 lines of one story). Each rank's step is read at
``SAMPLES`` times across the chart's window and compared with the job's median step there:
within ``tolerance`` steps of it counts as "with the job". Ranks with the same departures from
the median share a line; distinct departures that differ by ``tolerance`` at most are merged
after (ranks stuck at step 50 and at 51 while the job goes on). The culprits keep lines of their
own; then the biggest group, then the others slowest first, so a straggler is drawn.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from monitor.present.rank_ranges import ranks_text

Point = tuple[float, int]
# Per sample time, a rank's step less the job's median step there; None before its first point.
Departures = tuple[int | None, ...]

# The page's chart window (app.js CHART_WINDOW_S) and the lines it draws by default.
WINDOW_S = 300.0
LINES_SHOWN = 8
# Culprits drawn one to a line; past that many, they are grouped like the other ranks.
CULPRIT_LINES_MAX = 4
SAMPLES = 16
# Steps apart that still count as alike: ranks one step apart are in lockstep, caught mid-step.
TOLERANCE = 1
# Distinct departures compared against the newest this many groups of the same shape: bounds the
# merge at 10,000 ranks that all progress differently.
MERGE_SCAN = 16


@dataclass(frozen=True)
class ProgressGroup:
    ranks: tuple[int, ...]  # ascending
    points: tuple[Point, ...]  # its first rank's within the window, and the last one before it
    alive: bool
    culprit: bool
    step_low: int  # the lowest and highest newest step of its ranks
    step_high: int


@dataclass
class _Series:
    points: Sequence[Point]
    alive: bool
    ranks: list[int]


def progress_groups(ranks: Iterable[tuple[int, Sequence[Point], bool]], culprits: Iterable[int], now: float,
                    window_s: float = WINDOW_S, tolerance: int = TOLERANCE) -> list[ProgressGroup]:
    """Every rank with points, ``(rank, points oldest first, alive)``, in one group."""
    blamed = set(culprits)
    alone: list[tuple[int, Sequence[Point], bool]] = []
    # Ranks reading one job-scope log share one points object: sampled once.
    series: dict[tuple[int, bool], _Series] = {}
    for rank, points, alive in ranks:
        if not points:
            continue
        if rank in blamed and len(alone) < CULPRIT_LINES_MAX:
            alone.append((rank, points, alive))
            continue
        entry = series.get((id(points), alive))
        if entry is None:
            series[(id(points), alive)] = _Series(points, alive, [rank])
        else:
            entry.ranks.append(rank)
    start = now - window_s
    grid = [start + window_s * i / (SAMPLES - 1) for i in range(SAMPLES)]
    sampled = [(s, _sampled(s.points, grid)) for s in series.values()]
    medians = _medians(sampled, len(grid))
    # Per (alive, departures snapped to 0 within the tolerance): the first one's raw departures, and the series.
    departures: dict[tuple[bool, Departures], tuple[Departures, list[_Series]]] = {}
    for s, steps in sampled:
        raw = tuple(None if v is None or m is None else v - m for v, m in zip(steps, medians))
        key = tuple(None if d is None else (0 if -tolerance <= d <= tolerance else d) for d in raw)
        entry = departures.get((s.alive, key))
        if entry is None:
            departures[(s.alive, key)] = (raw, [s])
        else:
            entry[1].append(s)
    groups = [ProgressGroup((rank,), _in_window(points, start), alive, True, points[-1][1], points[-1][1])
              for rank, points, alive in alone]
    made = [_group(members, start, blamed) for members in _merged(departures, tolerance)]
    if made:
        biggest = min(made, key=lambda g: (-len(g.ranks), g.ranks[0]))
        made.remove(biggest)
        groups.append(biggest)
    groups += sorted(made, key=lambda g: (g.step_low, -len(g.ranks), g.ranks[0]))
    return groups


def _sampled(points: Sequence[Point], grid: Sequence[float]) -> tuple[int | None, ...]:
    """The step at each grid time: the newest point's at or before it; None before the first."""
    steps: list[int | None] = []
    i = 0
    for at in grid:
        i = bisect.bisect_right(points, (at, math.inf), i)  # from the last one: the grid ascends
        steps.append(points[i - 1][1] if i else None)
    return tuple(steps)


def _medians(sampled: Sequence[tuple[_Series, tuple[int | None, ...]]], samples: int) -> list[int | None]:
    """Per grid time, the median step over the ranks (a series weighs as many ranks as it holds)."""
    columns = list(zip(*(steps for _, steps in sampled))) or [() for _ in range(samples)]
    shared = [(steps, len(s.ranks) - 1) for s, steps in sampled if len(s.ranks) > 1]
    medians: list[int | None] = []
    for i, column in enumerate(columns):
        counts = Counter(column)  # steps repeat across ranks: counting them beats sorting 10,000
        for steps, more in shared:
            counts[steps[i]] += more
        counts.pop(None, None)
        middle, median = sum(counts.values()) / 2, None
        for step in sorted(counts):
            middle -= counts[step]
            median = step
            if middle <= 0:
                break
        medians.append(median)
    return medians


def _merged(departures: dict[tuple[bool, Departures], tuple[Departures, list[_Series]]],
            tolerance: int) -> list[list[_Series]]:
    """The series grouped: equal snapped departures, then raw departures ``tolerance`` apart at
    most wherever both ranks have a step (a rank's first point may fall either side of a sample)."""
    by_alive: dict[bool, list[tuple[Departures, list[_Series]]]] = {}
    for (alive, key), (raw, members) in sorted(departures.items(), key=lambda item: _order(item[0][1])):
        groups = by_alive.setdefault(alive, [])
        for anchor, joined in reversed(groups[-MERGE_SCAN:]):
            if all(a is None or b is None or abs(a - b) <= tolerance for a, b in zip(anchor, raw)):
                joined.extend(members)
                break
        else:
            groups.append((raw, list(members)))
    return [members for groups in by_alive.values() for _, members in groups]


def _order(key: Departures) -> tuple[int, ...]:
    return tuple(-(2**62) if v is None else v for v in key)


def _group(members: Sequence[_Series], start: float, blamed: set[int]) -> ProgressGroup:
    ranks = sorted(r for s in members for r in s.ranks)
    first = next(s for s in members if ranks[0] in s.ranks)
    newest = [s.points[-1][1] for s in members]
    return ProgressGroup(tuple(ranks), _in_window(first.points, start), any(s.alive for s in members),
                         not blamed.isdisjoint(ranks), min(newest), max(newest))


def _in_window(points: Sequence[Point], start: float) -> tuple[Point, ...]:
    """The points the chart draws: those at or after ``start`` and the last one before (the line
    enters at the left edge)."""
    i = bisect.bisect_left(points, (start, -math.inf))
    return tuple(points[max(0, i - 1):])


def progress_groups_dict(groups: Sequence[ProgressGroup], lines: int | None = LINES_SHOWN) -> dict[str, Any]:
    """The groups as the timeline answer holds them: at most ``lines`` (all without), with how many
    groups and ranks that leaves out."""
    shown = groups if lines is None else groups[:lines]
    return {
        "progress_groups": [{"ranks": ranks_text(g.ranks), "count": len(g.ranks), "culprit": g.culprit,
                             "alive": g.alive, "step_low": g.step_low, "step_high": g.step_high,
                             "points": [list(p) for p in g.points]} for g in shown],
        "progress_groups_total": len(groups),
        "progress_ranks_not_drawn": sum(len(g.ranks) for g in groups[len(shown):]),
    }
