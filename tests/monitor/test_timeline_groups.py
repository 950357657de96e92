"""Ranks that behave alike, grouped for the page (monitor/present/timeline_groups.py, progress_groups.py):
one row per story of states, one line per way of progressing, the culprits and the stragglers apart."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from monitor.present.progress_groups import CULPRIT_LINES_MAX, progress_groups, progress_groups_dict
from monitor.present.timeline_groups import (CULPRIT_ROWS_MAX, Span, culprits_first, span_groups,
                                             span_groups_dict)

NOW = 1000.0
START = NOW - 300


def deadlock_spans(ranks: range, idle: int, changed_at: float = NOW - 30) -> dict[int, list[Span]]:
    """Every rank running, then ``idle`` idle and the others in a collective from ``changed_at``."""
    return {r: [(START, changed_at, "running"), (changed_at, NOW, "idle" if r == idle else "in_collective")]
            for r in ranks}


def rows(spans: dict[int, Sequence[Span]], culprits: Sequence[int] = (), **kw: float) -> list[tuple[tuple[int, ...], bool]]:
    return [(g.ranks, g.culprit) for g in span_groups(spans.items(), culprits, **kw)]


def test_a_2000_rank_deadlock_is_two_rows_the_culprit_first() -> None:
    groups = span_groups(deadlock_spans(range(2000), idle=5).items(), culprits=[5])
    assert [(g.ranks, g.culprit) for g in groups] == [((5,), True), (tuple(r for r in range(2000) if r != 5), False)]
    assert groups[1].spans == ((START, NOW - 30, "running"), (NOW - 30, NOW, "in_collective"))
    answer = span_groups_dict(groups)
    assert [(g["ranks"], g["count"], g["culprit"]) for g in answer["groups"]] == [("5", 1, True), ("0-4,6-1999", 1999, False)]
    assert answer["groups_total"] == 2 and answer["ranks_not_drawn"] == 0


@pytest.mark.parametrize(("change_of_rank_1", "slack_s", "together"), [
    (NOW - 30, 2.0, True),        # one diagnosis pass: the same time
    (NOW - 28.5, 2.0, True),      # a pass later: the same event, seen late
    (NOW - 27.5, 2.0, False),     # 2.5 s later: another event
    (NOW - 28.5, 1.0, False),     # a tighter slack
])
def test_state_changes_within_the_slack_are_one_event(change_of_rank_1: float, slack_s: float, together: bool) -> None:
    spans = {**deadlock_spans(range(3), idle=99), **deadlock_spans(range(1, 2), idle=99, changed_at=change_of_rank_1)}
    expected = [((0, 1, 2), False)] if together else [((0, 2), False), ((1,), False)]
    assert rows(spans, slack_s=slack_s) == expected


def test_other_states_or_a_late_start_are_other_groups_biggest_first() -> None:
    spans: dict[int, Sequence[Span]] = {
        **deadlock_spans(range(10), idle=99),
        10: [(START, NOW - 30, "running"), (NOW - 30, NOW, "idle")],            # another state
        11: [(NOW - 100, NOW - 30, "running"), (NOW - 30, NOW, "in_collective")],  # seen late: a gap before
        12: [(START, NOW, "running")],                                          # never changed
        13: [(START, NOW, "running")],
    }
    assert rows(spans) == [(tuple(range(10)), False), ((12, 13), False), ((10,), False), ((11,), False)]


def test_many_culprits_get_rows_of_their_own_up_to_a_limit_then_are_grouped() -> None:
    culprits = list(range(0, 40, 2))  # 20 culprits, behaving alike
    groups = span_groups(deadlock_spans(range(40), idle=-1).items(), culprits)
    alone = culprits[:CULPRIT_ROWS_MAX]
    assert [(g.ranks, g.culprit) for g in groups] == [
        *[((r,), True) for r in alone], (tuple(culprits[CULPRIT_ROWS_MAX:]), True),
        (tuple(range(1, 40, 2)), False)]


def test_rows_are_bounded_and_what_is_left_out_is_counted() -> None:
    # 30 ranks, each changing state 10 s after the one before: 30 events, 30 rows.
    spans = {r: [(START, NOW - 300 + 10 * r + 1, "running"), (NOW - 300 + 10 * r + 1, NOW, "idle")] for r in range(30)}
    answer = span_groups_dict(span_groups(spans.items(), culprits=[29]), rows=4)
    assert [g["ranks"] for g in answer["groups"]] == ["29", "0", "1", "2"]
    assert answer["groups_total"] == 30 and answer["ranks_not_drawn"] == 26
    assert len(span_groups_dict(span_groups(spans.items(), [29]), rows=None)["groups"]) == 30


def test_ranks_that_changed_a_little_apart_each_join_the_first_event() -> None:
    # A chain 1.5 s apart: each is within the slack of the one before, not of the first; a group
    # holds those within the slack of its first.
    spans = {r: [(START, NOW - 60 + 1.5 * r, "running"), (NOW - 60 + 1.5 * r, NOW, "idle")] for r in range(4)}
    assert rows(spans) == [((0, 1), False), ((2, 3), False)]


@pytest.mark.parametrize(("culprits", "limit", "listed"), [
    ([], None, None),
    ([], 2, {0, 1}),
    ([7, 3], 2, {7, 3}),
    ([7, 99], 3, {7, 0, 1}),  # a culprit without a timeline is skipped
    ([7], 0, set()),
])
def test_the_per_rank_list_holds_the_culprits_then_the_lowest_ranks(
        culprits: list[int], limit: int | None, listed: set[int] | None) -> None:
    assert culprits_first(list(range(10)), culprits, limit) == listed


# --- progress ---

def steady(rank: int, first_step: int = 0, lag_s: float = 0.0, until: float = NOW) -> list[tuple[float, int]]:
    """A step every 10 s over the last 5 minutes, logged ``lag_s`` late; none after ``until``."""
    return [(START + 10 * i + lag_s, first_step + i) for i in range(31) if START + 10 * i + lag_s <= until]


def lines(ranks: list[tuple[int, list[tuple[float, int]], bool]], culprits: Sequence[int] = ()) -> list[tuple[tuple[int, ...], bool]]:
    return [(g.ranks, g.culprit) for g in progress_groups(ranks, culprits, NOW)]


def test_ranks_in_lockstep_are_one_line_however_their_log_times_jitter() -> None:
    ranks = [(r, steady(r, lag_s=(r % 7) * 0.9), True) for r in range(2000)]
    groups = progress_groups(ranks, [], NOW)
    # Caught mid-step: the newest steps of its ranks are 29 and 30.
    assert [(g.ranks, g.step_low, g.step_high) for g in groups] == [(tuple(range(2000)), 29, 30)]
    assert groups[0].points == tuple(steady(0))  # the line is its first rank's


def test_a_2000_rank_deadlock_draws_the_culprit_and_the_rest() -> None:
    stalled = [(r, steady(r, until=NOW - 30), True) for r in range(2000)]
    assert lines(stalled, culprits=[5]) == [((5,), True), (tuple(r for r in range(2000) if r != 5), False)]


@pytest.mark.parametrize(("others", "expected"), [
    # One step apart all along: caught mid-step, one line.
    ([(1, steady(1, first_step=1), True)], [((0, 1), False)]),
    # Ten steps behind: a line of its own, the slowest after the biggest.
    ([(1, steady(1, first_step=-10), True), (2, steady(2), True)], [((0, 2), False), ((1,), False)]),
    # Stopped two minutes ago at step 18 or 19 while the job went on: one line, apart.
    ([(1, steady(1, until=NOW - 120), True), (2, steady(2, lag_s=9, until=NOW - 120), True), (3, steady(3), True)],
     [((0, 3), False), ((1, 2), False)]),
    # The same steps, but ended: not a live rank's line (no flat run to now).
    ([(1, steady(1), False)], [((0,), False), ((1,), False)]),
    # No points: not drawn.
    ([(1, [], True)], [((0,), False)]),
])
def test_ranks_that_progress_otherwise_are_other_lines(
        others: list[tuple[int, list[tuple[float, int]], bool]], expected: list[tuple[tuple[int, ...], bool]]) -> None:
    assert lines([(0, steady(0), True), *others]) == expected


def test_ranks_sharing_a_job_log_are_sampled_once_and_share_a_line() -> None:
    shared = steady(0)
    assert lines([(r, shared, True) for r in range(5)]) == [(tuple(range(5)), False)]


def test_lines_list_culprits_the_biggest_then_the_slowest_bounded_and_counted() -> None:
    ranks = [(r, steady(r), True) for r in range(100)]
    ranks += [(100 + i, steady(100 + i, first_step=-10 * (i + 1)), True) for i in range(12)]  # 12 stragglers
    culprits = [0, 1, 2, 3, 4, 5]
    groups = progress_groups(ranks, culprits, NOW)
    assert [g.ranks for g in groups[:CULPRIT_LINES_MAX]] == [(r,) for r in culprits[:CULPRIT_LINES_MAX]]
    biggest = groups[CULPRIT_LINES_MAX]
    assert biggest.ranks == tuple(range(CULPRIT_LINES_MAX, 100)) and biggest.culprit  # the other culprits in it
    assert [g.ranks for g in groups[CULPRIT_LINES_MAX + 1:]] == [(111 - i,) for i in range(12)]  # slowest first
    answer = progress_groups_dict(groups, lines=8)
    assert [g["ranks"] for g in answer["progress_groups"]][CULPRIT_LINES_MAX:] == ["4-99", "111", "110", "109"]
    assert answer["progress_groups_total"] == 17 and answer["progress_ranks_not_drawn"] == 9


def test_a_line_holds_the_points_in_the_window_and_the_last_before() -> None:
    old = [(START - 50, 1), (START - 20, 2), (START + 10, 3), (NOW - 5, 4)]
    [group] = progress_groups([(0, old, True)], [], NOW)
    assert group.points == ((START - 20, 2), (START + 10, 3), (NOW - 5, 4))
    assert progress_groups_dict([group])["progress_groups"][0] == {
        "ranks": "0", "count": 1, "culprit": False, "alive": True, "step_low": 4, "step_high": 4,
        "points": [[START - 20, 2], [START + 10, 3], [NOW - 5, 4]]}
