"""A job's pace against its own best (monitor/ingest/pace.py): fed the agent's running count of progress lines
as reports arrive, read at the engine's passes. Pure: no server."""

from __future__ import annotations

from monitor.ingest.pace import BASELINE_MEMORY_S, JobPace

RANK0 = ("rank", "0")


def feed(pace: JobPace, start: float, seconds: float, events_per_s: float, events: int = 0,
         source: tuple[str, ...] = RANK0, every: float = 1.0) -> tuple[float, int]:
    """Reports ``every`` seconds for ``seconds``, the count growing at ``events_per_s``; returns (time, count)."""
    t, count, owed = start, events, 0.0
    while t < start + seconds:
        t += every
        owed += events_per_s * every
        whole = int(owed)
        count += whole
        owed -= whole
        pace.note(source, t, count)
    return t, count


def test_a_steady_job_settles_at_its_pace_and_runs_at_ratio_one() -> None:
    pace = JobPace()
    t, _ = feed(pace, 0.0, 12.0, 6.0)
    assert pace.view(t) is None  # not settled: too few measures
    t, _ = feed(pace, t, 30.0, 6.0, events=72)
    view = pace.view(t)
    assert view is not None and abs(view.baseline_s - 1 / 6) < 0.01
    assert abs(view.ratio - 1.0) < 0.05 and view.slow_since is None
    assert view.goodput is not None and view.goodput > 0.95


def test_a_fall_to_a_step_every_twelve_seconds_shows_before_and_after_the_first_slow_step() -> None:
    pace = JobPace()
    t, count = feed(pace, 0.0, 60.0, 6.0)
    # Throttled: silent 11 s, then a step every 12.5 s.
    assert pace.view(t + 5).slow_since is None  # a short silence is the agent's reading rhythm
    during = pace.view(t + 11)
    assert during.ratio > 50 and during.slow_since == t + 11  # the silence itself is the pace now
    t, count = feed(pace, t, 50.0, 0.08, events=count, every=12.5)
    view = pace.view(t)
    assert view.ratio > 50 and view.slow_since == during.slow_since
    assert view.goodput < 0.8
    # Lifted: back at pace within a measure's span.
    t, _ = feed(pace, t, 15.0, 6.0, events=count)
    view = pace.view(t)
    assert view.ratio < 1.5 and view.slow_since is None


def test_a_job_slow_from_its_first_step_is_at_its_own_pace() -> None:
    pace = JobPace()
    t, _ = feed(pace, 0.0, 200.0, 0.08, every=12.5)
    view = pace.view(t)
    assert view is not None and view.ratio < 1.2 and view.slow_since is None


def test_a_slow_start_then_the_real_pace_is_the_baseline() -> None:
    """Compilation and warm-up are slower: the baseline is the job's best, not its first."""
    pace = JobPace()
    t, count = feed(pace, 0.0, 40.0, 0.5)
    t, _ = feed(pace, t, 40.0, 5.0, events=count)
    view = pace.view(t)
    assert abs(view.baseline_s - 0.2) < 0.02 and view.ratio < 1.1


def test_a_job_that_logs_every_hundred_steps_has_a_pace_in_its_own_unit() -> None:
    pace = JobPace()
    t, count = feed(pace, 0.0, 200.0, 1 / 17, every=1.0)  # a line every 17 s
    view = pace.view(t)
    assert view is not None and 15 < view.baseline_s < 19 and view.ratio < 1.3
    t, _ = feed(pace, t, 200.0, 1 / 60, events=count)  # three and a half times slower
    assert pace.view(t).ratio > 3


def test_the_count_starting_over_is_measured_afresh_and_keeps_the_baseline() -> None:
    pace = JobPace()
    t, _ = feed(pace, 0.0, 60.0, 5.0)
    baseline = pace.view(t).baseline_s
    t, _ = feed(pace, t, 30.0, 5.0, events=0)  # a restarted agent counts from zero
    view = pace.view(t)
    assert view.baseline_s == baseline and view.ratio < 1.2


def test_another_source_takes_over_only_once_the_followed_one_stopped() -> None:
    pace = JobPace()
    t, _ = feed(pace, 0.0, 30.0, 5.0)
    pace.note(("rank", "1"), t, 10_000)
    assert pace.source == RANK0
    t, _ = feed(pace, t + 61, 30.0, 5.0, source=("rank", "1"), events=10_000)  # rank 0's log went quiet
    assert pace.source == ("rank", "1") and pace.view(t).ratio < 1.2


def test_a_pace_older_than_the_memory_is_forgotten() -> None:
    pace = JobPace()
    t, count = feed(pace, 0.0, 60.0, 6.0)
    t, _ = feed(pace, t, BASELINE_MEMORY_S + 60, 1.0, events=count)
    view = pace.view(t)
    assert abs(view.baseline_s - 1.0) < 0.1 and view.slow_since is None


def test_candidates_stay_few_on_a_job_that_keeps_slowing() -> None:
    pace = JobPace()
    t, count = 0.0, 0
    for i in range(200):
        t, count = feed(pace, t, 20.0, 10.0 / (1 + i / 20), events=count)
    assert len(pace.candidates) <= BASELINE_MEMORY_S / 5 + 1
