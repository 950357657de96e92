"""The straggler rules at one report a second and at one every 10 s (a big job's agents report less
often), table-style: a simulated job's reports go through ingest into its view and the diagnosis,
reading by reading. A deadlock that starts between two reports of most nodes (each node reports at
its own offset) must never read straggler on the way to deadlock; a rank slower over many steps, and
one that spins while its peers wait in a collective, are named at both cadences.

The simulated agent reports as the real one does (agent/procstat.py): ``cpu_percent`` is the rank's
CPU over the interval since its node's previous report, and a rank whose log has been silent for
STUCK_AFTER_S is dumped at that report (agent/stacks.py ``looks_stuck``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from monitor_reports import ALL_REDUCE_FRAMES, frame, progress, rank, report, stack

from monitor.diagnosis import Diagnosis, JobView, diagnose
from monitor.diagnosis.activity import classify
from monitor.diagnosis.cadence import job_cadence
from monitor.diagnosis.context import Context
from monitor.diagnosis.slow_rank import slow_ranks
from monitor.engine.views import job_view
from monitor.ingest.state import MonitorState
from monitor.ingest.tracks import Level
from monitor.ingest.wire import Report

JOB = "job-a"
RANKS_PER_NODE = 4
BUSY = 95.0
PARKED = 0.4
STUCK_AFTER_S = 2.0
RECENT_PROGRESS = 32
COMPUTE_FRAMES = [frame("forward", "/work/model.py", 40), frame("train_step", "/work/train.py", 44),
                  frame("<module>", "/work/train.py", 90)]
SAVE_FRAMES = [frame("save_checkpoint", "/work/train.py", 70), frame("<module>", "/work/train.py", 160)]
LINGER_FRAMES = [frame("main", "/work/train.py", 131), frame("<module>", "/work/train.py", 160)]


@dataclass
class Job:
    """A synchronous job of ``nodes`` nodes that steps every ``step_s``. From ``slow_from`` its
    ``slow_rank`` does ``slow_factor`` times the work a step, and the others wait the difference in
    all_reduce. From ``fault_at`` nothing steps: ``spinner`` spins at 100% CPU outside any collective
    while the others wait in all_reduce (a straggler of its own making), or, without a spinner, the
    job deadlocks: every rank waits, ``culprit`` outside the collective. Over ``checkpoint`` (from, to)
    nothing steps either: rank 0 saves at 100% CPU while the others wait for it in all_reduce."""

    nodes: int
    step_s: float = 0.5
    slow_rank: int | None = None
    slow_factor: float = 1.0
    slow_from: float = 0.0
    fault_at: float | None = None
    culprit: int = 1
    spinner: int | None = None
    checkpoint: tuple[float, float] | None = None

    @property
    def world(self) -> int:
        return self.nodes * RANKS_PER_NODE

    def steps(self, until: float) -> int:
        """How many steps the job has made by ``until``."""
        end = min(until, self.fault_at) if self.fault_at is not None else until
        if self.checkpoint is not None and end > self.checkpoint[0]:
            saved = int(self.checkpoint[0] / self.step_s)
            return saved + max(0, int((end - self.checkpoint[1]) / self.step_s))
        if self.slow_rank is None or end <= self.slow_from:
            return int(end / self.step_s)
        before = int(self.slow_from / self.step_s)
        return before + int((end - before * self.step_s) / (self.step_s * self.slow_factor))

    def cpu_at(self, r: int, t: float) -> float:
        """The rank's CPU at ``t`` (steps are far shorter than a report interval: the average over one)."""
        if self.fault_at is not None and t >= self.fault_at:
            return 100.0 if r == self.spinner else PARKED
        if self.saving(t):
            return 100.0 if r == 0 else PARKED
        if self.slow_rank is not None and t >= self.slow_from and r != self.slow_rank:
            return BUSY / self.slow_factor  # the rest of each step waits for the slow rank
        return BUSY

    def saving(self, t: float) -> bool:
        return self.checkpoint is not None and self.checkpoint[0] <= t < self.checkpoint[1]

    def cpu_over(self, r: int, start: float, end: float) -> float:
        """The rank's CPU over (start, end], as the agent measures it between two reports."""
        changes = (self.slow_from, self.fault_at, *(self.checkpoint or ()))
        edges = sorted({start, end, *(e for e in changes if e is not None and start < e < end)})
        return sum(self.cpu_at(r, a) * (b - a) for a, b in zip(edges, edges[1:])) / (end - start)


@dataclass
class Node:
    index: int
    offset: float
    previous: float | None = None
    dumps: dict[int, float] = field(default_factory=dict)
    # (when the agent read it, step): the agent reads its ranks' logs once a report, and sends the
    # last RECENT_PROGRESS steps it read (agent/logs.py).
    recent: list[tuple[float, int]] = field(default_factory=list)

    def report(self, job: Job, now: float, interval: float) -> Report:
        start = self.previous if self.previous is not None else now - interval
        self.previous = now
        steps = job.steps(now)
        read = self.recent[-1][1] if self.recent else 0
        self.recent = (self.recent + [(now, step) for step in range(read + 1, steps + 1)])[-RECENT_PROGRESS:]
        # Dumped once its log has said nothing new for a while (agent/stacks.py looks_stuck).
        stuck = bool(self.recent) and now - self.recent[-1][0] > STUCK_AFTER_S
        ranks = []
        for local in range(RANKS_PER_NODE):
            r = self.index * RANKS_PER_NODE + local
            ranks.append(rank(
                JOB, r, job.world, local_rank=local, pid=1000 + r, state="S" if stuck else "R",
                cpu_percent=job.cpu_over(r, start, now),
                progress=progress(steps, steps, self.recent),
                stack=self._stack(job, r, now, stuck),
            ))
        body = report(node=f"node-{self.index:03d}", ranks=ranks, sent_at=now)
        body["agent"]["interval_s"] = interval
        return Report.model_validate(body)

    def _stack(self, job: Job, r: int, now: float, stuck: bool) -> dict:
        """A background dump every 10 s, and one at each report while the rank looks stuck."""
        if stuck or now - self.dumps.get(r, -1e9) >= 10.0:
            self.dumps[r] = now
        taken = self.dumps[r]
        if job.saving(taken):
            return stack(taken, SAVE_FRAMES, active=True) if r == 0 else stack(taken, ALL_REDUCE_FRAMES, active=False)
        if job.fault_at is None or taken < job.fault_at:
            return stack(taken, COMPUTE_FRAMES, active=True)
        if r == job.spinner:
            return stack(taken, COMPUTE_FRAMES, active=True)
        return stack(taken, LINGER_FRAMES if r == job.culprit else ALL_REDUCE_FRAMES, active=False)


Judge = Callable[[JobView], Diagnosis | None]


def verdict(view: JobView) -> Diagnosis:
    return diagnose(view)


def level_rule(view: JobView) -> Diagnosis | None:
    """The straggler rule that reads the ranks' CPU levels, alone (diagnosis.slow_rank)."""
    cadence = job_cadence(view)
    return slow_ranks(Context(view, cadence, {r.rank: classify(r, cadence.last_progress_at) for r in view.ranks}))


def readings(job: Job, interval: float, until: float, judge: Judge, seed: int, every_s: float = 0.5,
             from_s: float = 0.0) -> list[tuple[float, str, tuple[int, ...]]]:
    """(time, verdict, culprits) of each reading from ``from_s`` on, the nodes reporting every
    ``interval`` at staggered offsets."""
    rng = random.Random(seed)
    nodes = [Node(i, rng.uniform(0, interval)) for i in range(job.nodes)]
    due = {n.index: n.offset for n in nodes}
    state = MonitorState()
    seen = []
    t = 0.0
    while t <= until:
        for n in nodes:
            while due[n.index] <= t:
                state.apply(n.report(job, due[n.index], interval), due[n.index])
                due[n.index] += interval
        if t >= from_s:
            found = judge(job_view(state.jobs[JOB], state.nodes, t))
            seen.append((t, found.verdict, found.culprit_ranks) if found else (t, "none", ()))
        t = round(t + every_s, 6)
    return seen


CADENCES = [pytest.param(1.0, id="1s"), pytest.param(10.0, id="10s")]


@pytest.mark.parametrize(("interval", "first_level_at", "span_s"), [
    (1.0, 20.0, 30.0),  # 15 samples over 20 s of the half-minute, as before
    (10.0, 70.0, 80.0),  # stretched to 8 reports: at least 4 samples over 53 s of 80
])
def test_a_level_needs_a_window_of_the_ranks_own_reports(interval: float, first_level_at: float,
                                                          span_s: float) -> None:
    level = Level()
    first = None
    for i in range(int(200 / interval)):
        level.add(i * interval, 50.0)
        if first is None and level.value is not None:
            first = i * interval
    assert (first, level.value, level.span_s) == (first_level_at, 50.0, span_s)
    assert level.samples is not None and level.samples[0][0] == 200 - interval - span_s


# One report a second leaves little to stagger: fewer nodes and seeds there keep the tests quick.
@pytest.mark.parametrize(("interval", "step_s", "nodes", "seeds"), [
    pytest.param(1.0, 0.5, 6, 1, id="1s-steps-0.5s"),
    pytest.param(1.0, 3.0, 6, 1, id="1s-steps-3s"),
    pytest.param(10.0, 0.5, 12, 5, id="10s-steps-0.5s"),
    pytest.param(10.0, 3.0, 12, 5, id="10s-steps-3s"),
])
def test_the_level_rule_never_names_a_straggler_in_a_deadlock_that_starts_mid_window(
        interval: float, step_s: float, nodes: int, seeds: int) -> None:
    """The rule runs while the job's silence is short for its pace (at 10 s a rank's log is read every
    10 s, so silence up to 40 s is): levels that moved with the stop on some ranks only would name
    the others."""
    job = Job(nodes=nodes, step_s=step_s, fault_at=100.0)
    for seed in range(seeds):
        seen = readings(job, interval, 160.0, level_rule, seed, from_s=95.0)
        assert not [s for s in seen if s[1] != "none"], (seed, [s for s in seen if s[1] != "none"][:3])


@pytest.mark.parametrize("interval", CADENCES)
def test_levels_exist_at_both_cadences_and_stay_put_once_the_job_stops(interval: float) -> None:
    job = Job(nodes=4, fault_at=150.0)
    state = MonitorState()
    rng = random.Random(3)
    for n in [Node(i, rng.uniform(0, interval)) for i in range(job.nodes)]:
        t = n.offset
        while t <= 240.0:
            state.apply(n.report(job, t, interval), t)
            t += interval
    levels = [r.cpu_level_percent for r in job_view(state.jobs[JOB], state.nodes, 240.0).ranks]
    assert levels == [pytest.approx(BUSY)] * job.world


def test_a_level_follows_a_new_pace_while_the_job_steps() -> None:
    state = MonitorState()
    job = Job(nodes=1)
    node = Node(0, 0.0)
    for t in range(0, 80, 10):
        state.apply(node.report(job, float(t), 10.0), float(t))
    track = state.jobs[JOB].ranks[0]
    assert track.cpu.value == pytest.approx(BUSY)
    job.slow_rank, job.slow_factor, job.slow_from = 1, 2.0, 80.0  # rank 0 now waits half of each step
    for t in range(80, 160, 10):
        state.apply(node.report(job, float(t), 10.0), float(t))
    assert track.cpu.value == pytest.approx(BUSY / 2)


@pytest.mark.parametrize(("interval", "nodes", "seeds"), [
    pytest.param(1.0, 6, 1, id="1s"),
    # A busy reading that mostly predates the stall names no straggler (diagnosis/stall.busy_since_stall).
    pytest.param(10.0, 12, 5, id="10s"),
])
def test_a_deadlock_is_never_read_as_straggler_on_the_way(interval: float, nodes: int, seeds: int) -> None:
    job = Job(nodes=nodes, fault_at=70.0)
    for seed in range(seeds):
        seen = readings(job, interval, 110.0, verdict, seed, from_s=65.0)
        assert not [s for s in seen if s[1] == "straggler"], (seed, [s for s in seen if s[1] == "straggler"][:3])
        assert seen[-1][1:] == ("deadlock", (job.culprit,)), (seed, seen[-1])


STRAGGLERS = [
    # (name, job, the slow rank, how long after the onset it is named at the latest)
    ("a rank 30% slower over many steps", Job(nodes=6, slow_rank=9, slow_factor=1.3, slow_from=40.0), 9, 90.0),
    ("a rank spinning while the others wait in all_reduce", Job(nodes=6, fault_at=60.0, spinner=9), 9, 30.0),
]


@pytest.mark.parametrize("interval", CADENCES)
@pytest.mark.parametrize(("name", "job", "slow", "within_s"), STRAGGLERS, ids=[s[0] for s in STRAGGLERS])
def test_a_real_straggler_is_named_at_both_cadences(interval: float, name: str, job: Job, slow: int,
                                                     within_s: float) -> None:
    onset = job.fault_at if job.fault_at is not None else job.slow_from
    seen = readings(job, interval, onset + within_s + 20.0, verdict, seed=1, from_s=onset - 10.0)
    alarms = [s for s in seen if s[1] != "healthy"]
    assert alarms and all(s[1:] == ("straggler", (slow,)) for s in alarms), alarms[:3]
    assert alarms[0][0] <= onset + within_s, alarms[0]
    assert seen[-1][1:] == ("straggler", (slow,)), seen[-1]


@pytest.mark.parametrize(("interval", "saving_s", "seeds"), [
    pytest.param(1.0, 60.0, 1, id="1s-saving-60s"),
    pytest.param(10.0, 20.0, 2, id="10s-saving-20s"),
    pytest.param(10.0, 60.0, 2, id="10s-saving-60s"),
    pytest.param(10.0, 120.0, 2, id="10s-saving-120s"),
])
def test_the_level_rule_never_names_the_rank_that_saved_a_checkpoint(interval: float, saving_s: float,
                                                                      seeds: int) -> None:
    """Rank 0 saves while the others wait for it: their levels over the save say nothing of their pace.
    The rule checks the job's steps over the straggler window; a level stretched past it (one report
    every 10 s) must not reach back over the save."""
    job = Job(nodes=8, checkpoint=(80.0, 80.0 + saving_s))
    for seed in range(seeds):
        seen = readings(job, interval, 80.0 + saving_s + 100.0, level_rule, seed, every_s=1.0, from_s=75.0)
        assert not [s for s in seen if s[1] != "none"], (seed, [s for s in seen if s[1] != "none"][:3])


@pytest.mark.parametrize(("interval", "spans"), [pytest.param(1.0, (30, 30), id="1s"),
                                                  pytest.param(10.0, (75, 90), id="10s")])
def test_the_straggler_evidence_says_how_long_its_level_spans(interval: float, spans: tuple[int, int]) -> None:
    """A rank reported every 10 s has its level over 8 of its reports (~80 s), not the 30-s window:
    the evidence says which."""
    name, job, slow, within_s = STRAGGLERS[0]
    said: list[Diagnosis] = []

    def judge(view: JobView) -> Diagnosis:
        said.append(verdict(view))
        return said[-1]

    readings(job, interval, job.slow_from + within_s + 20.0, judge, seed=1, from_s=job.slow_from + within_s)
    named = [d for d in said if d.verdict == "straggler"]
    assert named, [d.summary for d in said[-3:]]
    line = next(e for e in named[-1].evidence if e.startswith(f"rank {slow} "))
    found = re.search(r"median over the last (\d+)s", line)
    assert found and spans[0] <= int(found.group(1)) <= spans[1], line
