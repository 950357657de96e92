"""Per-rank state runs (monitor/engine/rank_timeline.py): what the page's timeline is drawn from."""

from __future__ import annotations

from monitor.engine.rank_timeline import RankTimeline, StateSpan

T0 = 1_700_000_000.0


def spans(timeline: RankTimeline, now: float, job_id: str = "job") -> dict[int, list[tuple[float, float, str]]]:
    return {rank: [(s.start - T0, s.end - T0, s.state) for s in runs] for rank, runs in timeline.spans(job_id, now).items()}


def test_a_new_run_only_when_the_state_changes_and_the_newest_lasts_until_now() -> None:
    timeline = RankTimeline()
    for at, states in [(0, {0: "running", 1: "running"}), (5, {0: "running", 1: "idle"}),
                       (10, {0: "in_collective", 1: "idle"}), (15, {0: "in_collective", 1: "idle"})]:
        timeline.record("job", T0 + at, states.items())
    assert spans(timeline, T0 + 20) == {
        0: [(0, 10, "running"), (10, 20, "in_collective")],
        1: [(0, 5, "running"), (5, 20, "idle")],
    }


def test_old_runs_leave_the_window_but_the_one_covering_its_start_is_clipped_to_it() -> None:
    timeline = RankTimeline(window_s=60)
    for at, state in [(0, "running"), (30, "idle"), (100, "running"), (130, "in_collective")]:
        timeline.record("job", T0 + at, [(0, state)])
    # At 130 the window starts at 70: "running" from 0 is gone, "idle" from 30 covers 70-100.
    assert spans(timeline, T0 + 130) == {0: [(70, 100, "idle"), (100, 130, "running"), (130, 130, "in_collective")]}


def test_runs_per_rank_are_bounded() -> None:
    timeline = RankTimeline(window_s=10_000, max_runs=4)
    for i in range(50):
        timeline.record("job", T0 + i, [(0, "running" if i % 2 else "idle")])
    assert [s[0] for s in spans(timeline, T0 + 50)[0]] == [46, 47, 48, 49]


def test_a_replayed_reading_older_than_the_newest_changes_nothing() -> None:
    timeline = RankTimeline()
    timeline.record("job", T0 + 10, [(0, "running")])
    timeline.record("job", T0 + 5, [(0, "failed")])
    assert spans(timeline, T0 + 20) == {0: [(10, 20, "running")]}


def test_forgotten_jobs_go() -> None:
    timeline = RankTimeline()
    timeline.record("a", T0, [(0, "running")])
    timeline.record("b", T0, [(0, "running")])
    timeline.forget(["b"])
    assert timeline.spans("a", T0 + 1) == {}
    assert timeline.spans("b", T0 + 1) == {0: [StateSpan(T0, T0 + 1, "running")]}


def test_a_healthy_jobs_ranks_are_one_running_run_however_busy() -> None:
    # A healthy rank moves between computing, writing and collectives every few seconds: kept as
    # such, 10,000 ranks would hold hundreds of runs each. Once the job is in trouble, states count.
    timeline = RankTimeline()
    for i in range(100):
        timeline.record("job", T0 + i, [(0, ("running", "writing", "in_collective")[i % 3])], healthy=True)
    timeline.record("job", T0 + 100, [(0, "in_collective")], healthy=False)
    timeline.record("job", T0 + 101, [(0, "idle")], healthy=False)
    assert spans(timeline, T0 + 110) == {0: [(0, 100, "running"), (100, 101, "in_collective"), (101, 110, "idle")]}


def test_spans_of_chosen_ranks_only() -> None:
    timeline = RankTimeline()
    timeline.record("job", T0, [(r, "running") for r in range(5)])
    assert timeline.ranks("job") == [0, 1, 2, 3, 4]
    assert list(timeline.spans("job", T0 + 1, ranks=[3, 1, 9])) == [1, 3]


def test_a_copy_of_the_runs_clipped_outside_the_lock_matches_the_spans() -> None:
    # The monitor copies the runs under its lock and clips them after (Monitor.rank_timeline):
    # the same spans, and a reading recorded meanwhile does not reach the copy.
    timeline = RankTimeline(window_s=60)
    for at, state in [(0, "running"), (30, "idle"), (100, "in_collective")]:
        timeline.record("job", T0 + at, [(0, state), (1, "running")])
    copied = timeline.runs("job", [1, 0, 7])
    timeline.record("job", T0 + 110, [(0, "failed")])
    assert list(copied) == [0, 1]
    assert timeline.clipped(copied, T0 + 105) == (
        (0, ((T0 + 45, T0 + 100, "idle"), (T0 + 100, T0 + 105, "in_collective"))),
        (1, ((T0 + 45, T0 + 105, "running"),)))
    assert list(timeline.runs("job")) == [0, 1]
