"""A job's rank timeline as rows people can read: ranks whose states changed alike share one row.

A 2,000-rank deadlock is two stories (rank 5 went idle; every other rank parked in all_reduce),
not 2,000 bars. Ranks are alike when they went through the same states in the same order and
changed state at the same times, give or take ``slack_s`` (ranks diagnosed in one pass share its
time exactly; a pass or two apart is the same event seen late). Each culprit keeps a row of its
own, first; then the groups, biggest first. Grouping is exact on the times first (cheap: ranks of
one pass share one key), and only the few distinct keys are then merged within the slack.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from monitor.present.rank_ranges import ranks_text

Span = tuple[float, float, str]

# Rows the page draws by default; the evidence download holds every group.
ROWS_SHOWN = 16
# Culprits drawn one to a row; past that many, the other culprits are grouped among themselves.
CULPRIT_ROWS_MAX = 8
# State changes this close together are one event seen by different diagnosis passes.
SLACK_S = 2.0
# Distinct keys of one state sequence compared against the newest this many groups of it: bounds
# the merge at 10,000 ranks that all changed at different times.
MERGE_SCAN = 16


@dataclass(frozen=True)
class SpanGroup:
    ranks: tuple[int, ...]  # ascending
    spans: tuple[Span, ...]  # its first rank's, oldest first
    culprit: bool


def span_groups(spans_by_rank: Iterable[tuple[int, Sequence[Span]]], culprits: Iterable[int],
                slack_s: float = SLACK_S) -> list[SpanGroup]:
    """Every rank in one group: the first CULPRIT_ROWS_MAX culprits alone (ascending), then the
    other culprits' groups, then the rest's groups, biggest first (ties: lowest rank first)."""
    spans = dict(spans_by_rank)
    blamed = sorted(set(culprits) & spans.keys())
    alone = blamed[:CULPRIT_ROWS_MAX]
    grouped_culprits = blamed[CULPRIT_ROWS_MAX:]
    blamed_set = set(blamed)
    rest = [(rank, s) for rank, s in spans.items() if rank not in blamed_set]
    return ([SpanGroup((rank,), tuple(spans[rank]), True) for rank in alone]
            + _by_size(_alike(((r, spans[r]) for r in grouped_culprits), slack_s), culprit=True)
            + _by_size(_alike(rest, slack_s), culprit=False))


def _alike(spans_by_rank: Iterable[tuple[int, Sequence[Span]]], slack_s: float) -> list[tuple[list[int], Sequence[Span]]]:
    """``(ranks, spans)`` per group of ranks whose spans match: same states, starts within ``slack_s``."""
    exact: dict[tuple[tuple[str, ...], tuple[float, ...]], tuple[list[int], Sequence[Span]]] = {}
    for rank, spans in spans_by_rank:
        key = (tuple(s[2] for s in spans), tuple(s[0] for s in spans))
        entry = exact.get(key)
        if entry is None:
            exact[key] = ([rank], spans)
        else:
            entry[0].append(rank)
    # Per state sequence, the groups made so far: (their first key's starts, ranks, spans).
    merged: dict[tuple[str, ...], list[tuple[tuple[float, ...], list[int], Sequence[Span]]]] = {}
    for (states, starts), (ranks, spans) in sorted(exact.items(), key=lambda item: item[0][1]):
        groups = merged.setdefault(states, [])
        for anchor, members, _ in reversed(groups[-MERGE_SCAN:]):
            if all(abs(a - b) <= slack_s for a, b in zip(anchor, starts)):
                members.extend(ranks)
                break
        else:
            groups.append((starts, ranks, spans))
    return [(members, spans) for groups in merged.values() for _, members, spans in groups]


def _by_size(groups: list[tuple[list[int], Sequence[Span]]], culprit: bool) -> list[SpanGroup]:
    made = [SpanGroup(tuple(sorted(ranks)), tuple(spans), culprit) for ranks, spans in groups]
    made.sort(key=lambda g: (-len(g.ranks), g.ranks[0]))
    return made


def span_groups_dict(groups: Sequence[SpanGroup], rows: int | None = ROWS_SHOWN) -> dict[str, Any]:
    """The groups as the timeline answer holds them: at most ``rows`` (all without), with how many
    groups and ranks that leaves out."""
    shown = groups if rows is None else groups[:rows]
    return {
        "groups": [{"ranks": ranks_text(g.ranks), "count": len(g.ranks), "culprit": g.culprit,
                    "spans": [list(s) for s in g.spans]} for g in shown],
        "groups_total": len(groups),
        "ranks_not_drawn": sum(len(g.ranks) for g in groups[len(shown):]),
    }


def culprits_first(ranks: Sequence[int], culprits: Iterable[int], limit: int | None) -> set[int] | None:
    """The ``limit`` ranks a per-rank list holds: the culprits, then the lowest ranks (``ranks``
    ascending); None for all of them."""
    if limit is None:
        return None
    known = set(ranks)
    leading = [r for r in dict.fromkeys(culprits) if r in known]
    lead = set(leading)
    return set((leading + [r for r in ranks if r not in lead])[:limit])
