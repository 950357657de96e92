"""Alarm confirmation (monitor.diagnosis.stability.settle), table-style: a sequence of raw
verdicts at given times in, the published verdicts out."""

from __future__ import annotations

import pytest

from monitor.diagnosis.model import Diagnosis
from monitor.diagnosis.stability import CLEAR_S, Settled, settle


def raw(verdict: str, culprits: tuple[int, ...] = ()) -> Diagnosis:
    return Diagnosis(verdict, culprits, None, f"raw {verdict}")


def published(readings: list[tuple[float, str, tuple[int, ...]]], progress_at: float | None = None) -> list[str]:
    """Feed (time, raw verdict, culprits) in order; return the published verdict after each."""
    state: Settled | None = None
    out = []
    for now, verdict, culprits in readings:
        state = settle(state, raw(verdict, culprits), now, progress_at)
        out.append(state.shown.verdict)
    return out


H, D, S = "healthy", "deadlock", "stalled"

CASES = {
    # A single odd reading never raises an alarm: the flap the issue reports.
    "one deadlock reading between healthy ones": (
        [(0, H, ()), (1, D, (1,)), (2, H, ())], [H, H, H]),
    # Two readings a second apart confirm it.
    "a deadlock that lasts": (
        [(0, H, ()), (1, D, (1,)), (2, D, (1,))], [H, H, D]),
    # Two readings too close together are not enough: time must pass as well.
    "two deadlock readings 0.2 s apart": (
        [(0, H, ()), (1, D, (1,)), (1.2, D, (1,)), (2.1, D, (1,))], [H, H, H, D]),
    # stalled becoming deadlock as the stacks arrive is one trouble: the count goes on.
    "stalled then deadlock": (
        [(0, H, ()), (1, S, ()), (2, D, (1,))], [H, H, D]),
    "a straggler for 0.5 s": (
        [(0, H, ()), (1, "straggler", (1,)), (1.5, "straggler", (1,))], [H, H, H]),
    "a straggler for 1 s": (
        [(0, H, ()), (1, "straggler", (1,)), (2, "straggler", (1,))], [H, H, "straggler"]),
    # Facts are published at once.
    "an exit": ([(0, H, ()), (1, "rank_exited", (1,))], [H, "rank_exited"]),
    "a stop": ([(0, H, ()), (1, "rank_stopped", (1,))], [H, "rank_stopped"]),
    "a finish": ([(0, H, ()), (1, "finished", ())], [H, "finished"]),
    # A raised alarm holds through one healthy reading without progress ...
    "one healthy reading inside a deadlock": (
        [(0, D, (1,)), (1, D, (1,)), (2, H, ()), (3, D, (1,))], [H, D, D, D]),
    # ... and clears once healthy readings last CLEAR_S.
    "a deadlock that clears without progress": (
        [(0, D, (1,)), (1, D, (1,)), (2, H, ()), (2 + CLEAR_S, H, ())], [H, D, D, H]),
    # A deadlock does not fall back to a bare stall at one reading (stacks stale for a moment) ...
    "one stalled reading inside a deadlock": (
        [(0, D, (1,)), (1, D, (1,)), (2, S, ()), (3, D, (1,))], [H, D, D, D]),
    # ... only once such readings last CLEAR_S.
    "a deadlock that turns into a stall": (
        [(0, D, (1,)), (1, D, (1,)), (2, S, ()), (2 + CLEAR_S, S, ())], [H, D, D, S]),
    # A raised deadlock does not turn into another alarm at one reading (a half-refreshed
    # picture after a restart read as a straggler) ...
    "one straggler reading inside a deadlock": (
        [(0, D, (1,)), (1, D, (1,)), (2, "straggler", (1,)), (2.3, D, (1,))], [H, D, D, D]),
    # ... only once that alarm is confirmed.
    "a deadlock that turns into slow compute": (
        [(0, D, (1,)), (1, D, (1,)), (2, "slow_compute", (1,)), (3, "slow_compute", (1,))],
        [H, D, D, "slow_compute"]),
    # Two readings of different alarms confirm neither (they read one odd picture two ways).
    "a straggler reading then a slow compute one inside a deadlock": (
        [(0, D, (1,)), (1, D, (1,)), (2, "straggler", (1,)), (3, "slow_compute", ()), (4, D, (1,))],
        [H, D, D, D, D]),
    "a straggler reading then a slow compute one": (
        [(0, H, ()), (1, "straggler", (1,)), (2, "slow_compute", ()), (3, "slow_compute", ())],
        [H, H, H, "slow_compute"]),
    # A bare stall is sharpened at once: the stacks arrived.
    "a stall that turns into a straggler": (
        [(0, S, ()), (1, S, ()), (2, "straggler", (1,))], [H, S, "straggler"]),
    # An exit during an alarm is news: published at once.
    "an exit during a deadlock": (
        [(0, D, (1,)), (1, D, (1,)), (2, "rank_exited", (1,))], [H, D, "rank_exited"]),
    # The first reading of a new job is an alarm: still confirmed first.
    "a job first seen deadlocked": ([(0, D, (1,)), (1, D, (1,))], [H, D]),
    # An agent going silent (or a restart) is no news: a raised alarm stays raised ...
    "a deadlock while an agent is silent": (
        [(0, D, (1,)), (1, D, (1,)), (2, "unknown", ()), (30, "unknown", ()), (31, D, (1,))], [H, D, D, D, D]),
    # ... and unknown is published at once otherwise.
    "a healthy job whose agent goes silent": ([(0, H, ()), (1, "unknown", ())], [H, "unknown"]),
}


@pytest.mark.parametrize("readings,expected", CASES.values(), ids=CASES.keys())
def test_published_verdicts(readings, expected) -> None:
    assert published(readings) == expected


def test_progress_after_the_alarm_clears_it_at_once() -> None:
    state = None
    for now, verdict in ((0, D), (1, D)):
        state = settle(state, raw(verdict, (1,)), now, last_progress_at=None)
    assert state.shown.verdict == D
    state = settle(state, raw(H), 2, last_progress_at=1.5)
    assert state.shown.verdict == H


def test_lines_the_alarm_was_raised_against_do_not_clear_it_at_once() -> None:
    """A deadlock named while a side thread's counter kept rising (diagnosis.held): one healthy reading
    (a rank's CPU blip) with that counter still rising holds the alarm; CLEAR_S of them clear it."""
    from dataclasses import replace

    against_lines = replace(raw(D, (1,)), progress_discounted_after=0.5)
    state = None
    for now in (0, 1):
        state = settle(state, against_lines, now, last_progress_at=now)
    assert state.shown.verdict == D
    state = settle(state, raw(H), 2, last_progress_at=2)
    assert state.shown.verdict == D
    state = settle(state, raw(H), 2 + CLEAR_S, last_progress_at=2 + CLEAR_S)
    assert state.shown.verdict == H


def test_confirming_shows_the_held_verdict_and_says_what_it_checks() -> None:
    state = settle(None, raw(H), 0, None)
    state = settle(state, raw(D, (1,)), 1, None)
    shown = state.shown
    assert (shown.verdict, shown.culprit_ranks, shown.hints) == (H, (), ())
    assert "possible deadlock" in shown.summary and "raw deadlock" in shown.summary


def test_the_culprits_follow_the_newest_raw_alarm() -> None:
    state = None
    for now, culprits in ((0, (1,)), (1, (1,)), (2, (0, 1))):
        state = settle(state, raw(D, culprits), now, None)
    assert state.shown.culprit_ranks == (0, 1)


def test_an_alarm_built_on_an_ended_process_is_published_at_once() -> None:
    """A launcher that exited with EADDRINUSE: rendezvous_hang is final, nothing to confirm."""
    from dataclasses import replace

    state = settle(None, raw(H), 0, None)
    state = settle(state, replace(raw("rendezvous_hang"), final=True), 1, None)
    assert state.shown.verdict == "rendezvous_hang"


def test_an_alarm_confirmed_in_place_of_another_keeps_when_the_trouble_began() -> None:
    state = None
    for now, verdict in ((0, D), (1, D), (2, "straggler"), (3, "straggler")):
        state = settle(state, raw(verdict, (1,)), now, None)
    assert (state.shown.verdict, state.alarm_since) == ("straggler", 1)
    assert "checking a reading of deadlock" in settle(state, raw(D, (1,)), 4, None).shown.summary


def test_an_alarm_of_the_outages_past_is_not_held_as_the_present() -> None:
    """Reports replayed after an outage raised slow compute at their own times; after the restart
    the monitor cannot see yet ("unknown"): it says so, not the past's alarm. The first live
    reading of the same trouble is published at once (the replay's alarm is the basis), one of
    another trouble is confirmed as a new alarm would be."""
    from dataclasses import replace

    state = None
    for now in (0.0, 1.0):  # replayed
        state = replace(settle(state, raw("slow_compute"), now, None, live=False), from_replay=True)
    assert state is not None and state.shown.verdict == "slow_compute"
    refreshing = settle(state, raw("unknown"), 30.0, None)
    assert refreshing.shown.verdict == "unknown" and refreshing.basis.verdict == "slow_compute"
    assert settle(refreshing, raw("slow_compute"), 31.0, None).shown.verdict == "slow_compute"
    # Another trouble live: judged afresh, shown as not known until confirmed (never the past's alarm).
    other = settle(refreshing, raw(D, (1,)), 31.0, None)
    assert other.shown.verdict == "unknown" and "checking that a possible deadlock lasts" in other.shown.summary
    assert settle(other, raw(D, (1,)), 32.0, None).shown.verdict == D
    # A live alarm, by contrast, is held through an agent's silence.
    live = settle(settle(None, raw(D, (1,)), 0.0, None), raw(D, (1,)), 1.0, None)
    assert settle(live, raw("unknown"), 5.0, None).shown.verdict == D
