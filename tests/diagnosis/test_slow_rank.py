"""A straggler in a job that still steps (diagnosis.slow_rank), table-style: the rank whose steady CPU
level stands clear above its peers' is named; shapes of healthy jobs are not."""

from __future__ import annotations

import random

import pytest

from monitor.diagnosis import JobView, diagnose
from monitor.diagnosis.model import CPU_LEVEL_WINDOW_S
from monitor.ingest.tracks import RankTrack
from tests.diagnosis.builders import NOW, computing, job, rank, steps

STEPPING = steps(NOW - 0.5, 1.0, count=60)  # a step a second for the last minute, still going


def levels(*values: float, progress: tuple[float, ...] = STEPPING, per_node: int = 8, **extra) -> JobView:
    ranks = [rank(r, cpu=v, cpu_level_percent=v, frames=computing(), active=True, state="R",
                  node=f"node-{r // per_node:04d}", **extra) for r, v in enumerate(values)]
    return job(*ranks, progress=progress)


def noisy(n: int, low: float, high: float, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(low, high) for _ in range(n)]


RESUMED = steps(NOW - 0.5, 1.0, count=10) + ()  # ten steps after a 20-s silence
RESUMED = tuple(sorted(steps(NOW - 30, 1.0, count=30) + RESUMED))

CASES: list[tuple[str, JobView, str, tuple[int, ...]]] = [
    ("one rank of 8 does 30% more work per step: it sets the pace",
     levels(77, 76, 78, 100, 77, 77, 79, 76), "straggler", (3,)),
    ("two ranks: the busier one by 30%",
     levels(77, 100), "straggler", (1,)),
    ("two ranks sharing two cores with other work: CPU time is work, the ratio holds",
     levels(43, 57), "straggler", (1,)),
    ("a whole node (8 ranks of 64) slower",
     levels(*([77.0] * 16 + [99.0] * 8 + [77.0] * 40)), "straggler", tuple(range(16, 24))),
    ("every rank at the same level, with noise",
     levels(*noisy(64, 90, 99)), "healthy", ()),
    ("one rank 15% busier: under the bar",
     levels(77, 77, 88.5, 77), "healthy", ()),
    ("low levels: a ratio of 1.5 is 4 points of noise",
     levels(8, 8, 12, 8), "healthy", ()),
    ("a pipeline's busy half: a shape, not a straggler",
     levels(*([100.0] * 4 + [77.0] * 4)), "healthy", ()),
    ("a slope of levels across a mixed fleet: nobody stands clear",
     levels(*[70 + 2 * i for i in range(16)]), "healthy", ()),
    ("a checkpoint phase inside the window: rank 0's busy stretch is not its pace",
     job(*levels(100, 77, 77, 77).ranks, progress=STEPPING, phase_marks=((NOW - 10, "checkpoint"),)),
     "healthy", ()),
    ("progress resumed 10 s ago after a 20-s silence: the window holds the stall",
     levels(100, 77, 77, 77, progress=RESUMED), "healthy", ()),
    ("warming up: two steps seen",
     levels(100, 77, 77, 77, progress=(NOW - 2, NOW - 1)), "healthy", ()),
    ("GPU ranks: NCCL waits spin, CPU cannot rank them",
     levels(100, 77, 77, 77, gpu_utilization_percent=95.0), "healthy", ()),
]


@pytest.mark.parametrize(("name", "view", "verdict", "culprits"), CASES, ids=[c[0] for c in CASES])
def test_slow_rank_table(name: str, view: JobView, verdict: str, culprits: tuple[int, ...]) -> None:
    found = diagnose(view)
    assert (found.verdict, found.culprit_ranks) == (verdict, culprits), found.summary


def test_most_ranks_without_a_level_is_no_judgement() -> None:
    view = levels(100, 77, 77, 77)
    ranks = [view.ranks[0], *(r.__class__(**{**r.__dict__, "cpu_level_percent": None}) for r in view.ranks[1:])]
    assert diagnose(job(*ranks, progress=STEPPING)).verdict == "healthy"


def test_one_slow_rank_among_ten_thousand_is_named_alone_and_told_in_a_few_lines() -> None:
    values = noisy(10_000, 75, 79)
    values[5] = 97.0
    found = diagnose(levels(*values))
    assert (found.verdict, found.culprit_ranks) == ("straggler", (5,))
    assert found.summary.startswith("rank 5 sets the job's pace: 1.2"), found.summary
    assert "rank 5 on node-0000: 97% CPU" in found.evidence[0]
    assert "the other 9,999 ranks: 77% CPU (middle half 76-78%)" in found.evidence[1]
    assert len(found.evidence) < 8 and any("node-0000" in h for h in found.hints)


def test_wait_shares_back_the_levels_up_when_stacks_were_sampled() -> None:
    view = levels(77, 100, 77, 77)
    ranks = [r.__class__(**{**r.__dict__, "collective_wait_share": 0.0 if r.rank == 1 else 0.25})
             for r in view.ranks]
    found = diagnose(job(*ranks, progress=STEPPING))
    assert "stack samples waiting in a collective: 0% on rank 1, 25% on the others" in found.evidence


def _track() -> RankTrack:
    from monitor.ingest.wire import RankReport

    report = RankReport.model_validate({"job_id": "j", "rank": 0, "world_size": 2, "pid": 1, "alive": True})
    return RankTrack(job_id="j", rank=0, node="n", pid=1, first_seen_at=0.0, observed_at=0.0, latest=report)


def test_a_rank_level_is_the_median_of_a_full_enough_window_worked_out_every_few_seconds() -> None:
    track = _track()
    for t in range(20):
        track.cpu.add(float(t), 50.0)
    assert track.cpu.value is None  # 20 samples, but over 19 s: the window is not full enough
    track.cpu.add(20.0, 50.0)
    assert track.cpu.value == 50.0
    # A burst on rank 0 (a log flush, a short evaluation) under half the window leaves the level.
    for t in range(21, 31):
        track.cpu.add(float(t), 100.0)
    assert track.cpu.value == 50.0
    # Once the busy stretch fills most of the window, the level follows it.
    for t in range(31, 51):
        track.cpu.add(float(t), 100.0)
    assert track.cpu.value == 100.0
    # Samples older than the window are dropped; the level is redone at most every 5 s.
    assert track.cpu.samples[0][0] >= 50 - CPU_LEVEL_WINDOW_S
    level_at = track.cpu.at
    track.cpu.add(51.0, 0.0)
    assert track.cpu.at == level_at


def test_a_shorter_window_gives_levels_sooner_and_judges_steadiness_over_itself() -> None:
    track = _track()
    for t in range(9):
        track.cpu.add(float(t), 50.0, window_s=12.0)
    assert track.cpu.value == 50.0  # 6 samples over 8 s: two thirds of a 12-s window
    # The rule looks for steady steps over the job's own window: a 20-s silence that ended 15 s ago
    # spoils a 30-s window but not a 12-s one.
    resumed = tuple(sorted(steps(NOW - 35, 1.0, count=10) + steps(NOW - 0.5, 1.0, count=15)))
    view = levels(100, 77, 77, 77, progress=resumed)
    assert diagnose(view).verdict == "healthy"
    short = JobView(**{**view.__dict__, "cpu_level_window_s": 12.0})
    found = diagnose(short)
    assert (found.verdict, found.culprit_ranks) == ("straggler", (0,))
    assert "rank 0 on node-0000: 100% CPU (median over the last 12s)" in found.evidence[0]
