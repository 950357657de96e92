"""Fail-slow (issue 35) on real jobs: a job that keeps stepping at a fraction of its own pace is named,
with what slows it, and nothing else is called an alarm.

- Both nodes' links throttled mid-run (tbf 4 Mbit/s on each node's eth0, the two-node cluster of
  tests/e2e/test_multinode.py): ``slow_network`` naming node-a and node-b, never stalled or deadlock
  (the job still steps), and ``healthy`` again once the throttle is lifted.
- Rank 1 of a compute-bound job squeezed mid-run onto one core beside three busy processes (a noisy
  neighbour, ``taskset``): ``straggler`` [1], with its run-queue wait as the evidence.

The step times before and after (from the job's own ``dt`` lines) and the ranks' CPU and run-queue
wait (/proc/PID/schedstat) are printed for whoever tunes the monitor (``pytest -s``).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hangwatch.demo.harness import Job, MonitorClient, Reaper, launch_torchrun
from tests.e2e.answers import compact, text_of
from tests.e2e.conftest import OwnMonitor
from tests.e2e.test_multinode import Cluster, two_nodes

pytestmark = [pytest.mark.e2e]

Allowed = Callable[[str, tuple[int, ...]], bool]

# ---------------------------------------------------------------- links throttled mid-run

# The monitor settles a job's pace from about 15-20 s of steady steps (issue 35: a baseline per job
# once it has settled); the throttle comes after this long at the normal pace.
BASELINE_S = 20.0
# Issue 35's target: slow_network at most this long after the links slow down.
SLOW_NETWORK_WITHIN_S = 60.0
# Once the throttle is lifted the next step is quick again; the monitor needs a few steps at the old
# pace to call the job healthy.
HEALTHY_AGAIN_WITHIN_S = 45.0
# All-reduce dominates the throttled step: 4.4 MB of gradients a step, ~20 ms on the bridge and
# ~10-12 s at 4 Mbit/s, where the old rules said deadlock and stalled before slow steps. A 0.1-s data
# wait makes the normal step ~0.13 s, near the case (170 ms to 12.5 s); with none, both ranks
# computed flat out through the baseline (the test took 58 CPU-s alone, 18 with the wait).
# (test_slow_link_is_healthy's 384-wide model, 0.6 MB: 12 ms and 1.5 s a step, too short a silence for
# any rule to mistake for a hang.)
ALLREDUCE_BOUND = ("--steps", "100000", "--hidden", "1024", "--step-sleep", "0.1")
THROTTLE = ("root", "tbf", "rate", "4mbit", "burst", "32kbit", "latency", "400ms")
# The pace must have fallen to a third of the baseline at least (issue 35: "e.g. to a third").
SLOW_RATIO = 3.0


def on_link_test(verdict: str, culprits: tuple[int, ...]) -> bool:
    """A slow link is slow_network or nothing: the job keeps stepping, so never stalled or deadlock,
    and no rank is slower than the other, so never straggler or slow_compute. ``unknown`` is no alarm
    and is right for a moment: the agents' reports share the throttled link, one that times out sends
    the agent into its outage journal, and the monitor does not judge from replayed reports."""
    return verdict in ("healthy", "slow_network", "unknown")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with two_nodes(tmp_path) as c:
        yield c


@pytest.mark.timeout(240)
def test_links_throttled_mid_run_are_slow_network_and_healthy_again_when_lifted(cluster: Cluster):
    a, b = cluster.a, cluster.b
    cluster.launch(a, 0, *ALLREDUCE_BOUND)
    cluster.launch(b, 1, *ALLREDUCE_BOUND)
    log = cluster.jobs["node-a"]
    log.wait_for_step(3, timeout=90)
    got = cluster.wait_for_verdict("healthy", culprits=[])
    # The job's normal pace, long enough for a baseline: healthy all the while.
    seen = [got, *cluster.watch(BASELINE_S)]
    before = [j for j in seen if j is not None]
    wrong = [j for j in before if j["verdict"] != "healthy"]
    assert not wrong, f"alarm at the normal pace: {sequence(before)}\n{compact(wrong[0])}"

    throttled_at = time.time()
    throttled = []
    try:
        for node in (a, b):
            node.tc("qdisc", "add", "dev", node.ifname, *THROTTLE)
            throttled.append(node)
        # Steps logged by now ran fast. The one in flight counts as throttled (a fast step is ~20 ms of its
        # ~10 s), as do those logged before the lift; the one in flight at the lift counts as neither.
        step_at_throttle = last_step(log)
        got, during = poll_until(
            cluster.client, cluster.job_id, SLOW_NETWORK_WITHIN_S, on_link_test,
            done=lambda j: j["verdict"] == "slow_network" and "node-a" in text_of(j) and "node-b" in text_of(j),
            what="slow_network naming node-a and node-b",
            context=lambda: step_times(log, before=(4, step_at_throttle), throttled=(step_at_throttle + 1, None))
            + "\n" + cluster.context())
        named_after = time.time() - throttled_at
    finally:
        step_at_lift, lifted_at = last_step(log), time.time()
        for node in throttled:
            node.tc("qdisc", "del", "dev", node.ifname, "root")
    print(f"\nslow_network {named_after:.1f}s after the throttle (verdicts: {sequence(during)}); pace: {got.get('pace')}\n"
          f"summary: {got['summary']}\nevidence: {got['evidence']}")
    check_pace(got)

    got, after = poll_until(cluster.client, cluster.job_id, HEALTHY_AGAIN_WITHIN_S, on_link_test,
                            done=lambda j: j["verdict"] == "healthy",
                            what="healthy once the throttle is lifted", context=cluster.context)
    print(f"healthy {time.time() - lifted_at:.1f}s after the lift (verdicts: {sequence(after)})\n"
          + step_times(log, before=(4, step_at_throttle), throttled=(step_at_throttle + 1, step_at_lift),
                       lifted=(step_at_lift + 2, None)))
    # The monitor's own record of published verdicts, also those between two polls: no alarm either.
    history = cluster.client.history(cluster.job_id) or []
    alarms = [h for h in history if h["at"] >= throttled_at and not on_link_test(h["verdict"], ())]
    assert not alarms, f"the monitor published an alarm while the link was slow: {alarms}"


def check_pace(job: dict) -> None:
    """The answer's pace figure, where it has one: at a third of the baseline or slower."""
    if "pace" not in job:
        print("note: the answer has no 'pace' key: its ratio not checked")
        return
    pace = job["pace"]
    assert pace and pace.get("ratio") is not None, f"no pace ratio in the slow_network answer: {pace}\n{compact(job)}"
    assert pace["ratio"] >= SLOW_RATIO, f"pace ratio {pace['ratio']} < {SLOW_RATIO}: {pace}\n{compact(job)}"


# ---------------------------------------------------------------- a noisy neighbour


# The job steps steadily this long before the squeeze: the ranks' CPU levels (over LEVEL_WINDOW_S,
# the test's own monitor's straggler window) and the pace are known.
STEADY_S = 10.0
# Issue 35's target: straggler [1] with its run-queue evidence at most this long after the squeeze.
STRAGGLER_WITHIN_S = 30.0
# A compute-bound step (~40-60 ms here: a 2048-row batch through a 384-wide MLP, 0.6 MB all-reduced
# over loopback, no simulated data loading). A fixed amount of work per step, so a rank that gets less
# CPU takes longer (--step-seconds would compute for a fixed time however little CPU it gets).
COMPUTE_BOUND = ("--steps", "100000", "--hidden", "384", "--batch", "2048", "--step-sleep", "0")
NEIGHBOURS = 3
RUN_QUEUE = re.compile(r"run[- ]queue|waiting for a (CPU|core)", re.I)


def on_squeeze_test(verdict: str, culprits: tuple[int, ...]) -> bool:
    """The squeezed rank is the job's straggler; nothing else is wrong (its links are not slow)."""
    return verdict == "healthy" or (verdict == "straggler" and culprits == (1,))


@pytest.mark.cpu_bound
# After the 30%-straggler test on its worker, not beside it: the neighbours take a core from whatever
# runs beside them, and that test compares its ranks' CPU levels. Beside the other cpu_bound tests
# instead, whose busy ranks then share rank 0's core: rank 0 waits for a CPU too (21-29% of the time
# where they overlapped here, rank 1 ~52%).
@pytest.mark.xdist_group("cpu_bound_levels")
@pytest.mark.timeout(150)
def test_a_rank_squeezed_by_a_noisy_neighbour_is_straggler_with_its_run_queue_wait(
        reaper: Reaper, tmp_path: Path, short_window_monitor: OwnMonitor):
    cores = sorted(os.sched_getaffinity(0))
    assert len(cores) >= 2, f"needs two cores to pin the ranks apart, has {cores}"
    squeezed_core, free_core = cores[0], cores[1]
    client, agent, monitor = short_window_monitor.client, short_window_monitor.agent, short_window_monitor.monitor
    job = launch_torchrun(reaper, tmp_path, list(COMPUTE_BOUND))
    pids = job.rank_pids(timeout=30)
    job.wait_for_step(5, timeout=60)
    got = short_window_monitor.wait_for_verdict(job, "healthy", culprits=[])
    seen = [got, *watch(client, job, STEADY_S)]
    before = [j for j in seen if j is not None]
    wrong = [j for j in before if j["verdict"] != "healthy"]
    assert not wrong, f"alarm before the squeeze: {sequence(before)}\n{compact(wrong[0])}"

    # Rank 1 (every thread) on one core with the neighbours, rank 0 alone on the other: the only
    # difference between the ranks is the neighbours. Each of the four gets a quarter of the core (the
    # issue's "rank 1 at 25% CPU") however the kernel shares it: by session (autogroup; each neighbour
    # has a session of its own, as each rank has) or by niceness (nice 5, as the harness starts jobs).
    taskset("-a", "-p", "-c", str(squeezed_core), str(pids[1]))
    taskset("-a", "-p", "-c", str(free_core), str(pids[0]))
    for _ in range(NEIGHBOURS):
        reaper.popen(["taskset", "-c", str(squeezed_core), sys.executable, "-c", "while True: pass"],
                     preexec_fn=lambda: os.nice(5))
    squeezed_at, step_at_squeeze = time.time(), last_step(job)
    sched_at = {rank: schedstat(pid) for rank, pid in pids.items()}

    def figures() -> str:
        return (step_times(job, before=(6, step_at_squeeze), squeezed=(step_at_squeeze + 2, None)) + "\n"
                + cpu_note(pids, sched_at, squeezed_at))

    def context() -> str:
        return "\n".join([figures(), "job log:\n" + job.log_tail(10), "agent log:\n" + agent.log_tail(10),
                          "monitor log:\n" + monitor.log_tail(10)])

    got, during = poll_until(client, job.job_id, STRAGGLER_WITHIN_S, on_squeeze_test,
                             done=lambda j: j["verdict"] == "straggler" and tuple(sorted(j["culprit_ranks"])) == (1,)
                             and bool(RUN_QUEUE.search("\n".join(j["evidence"]))),
                             what="straggler [1] with run-queue evidence", context=context)
    print(f"\nstraggler {time.time() - squeezed_at:.1f}s after the squeeze (at step {step_at_squeeze}); "
          f"verdicts: {sequence(during)}\n{figures()}\nevidence: {got['evidence']}")


def taskset(*args: str) -> None:
    subprocess.run(["taskset", *args], check=True, capture_output=True, timeout=10)


def schedstat(pid: int) -> tuple[int, int]:
    """(ns on a CPU, ns waiting on a run queue) of the process's main thread."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(on_cpu), int(waiting)


def cpu_note(pids: dict[int, int], since: dict[int, tuple[int, int]], at: float) -> str:
    """Each rank's share of a core on a CPU and waiting for one, since the squeeze (main threads)."""
    span = max(time.time() - at, 1e-3)
    parts = []
    for rank, pid in sorted(pids.items()):
        try:
            on_cpu, waiting = schedstat(pid)
        except OSError:
            continue
        parts.append(f"rank {rank}: on a CPU {(on_cpu - since[rank][0]) / 1e9 / span:.2f}, "
                     f"run-queue wait {(waiting - since[rank][1]) / 1e9 / span:.2f} (s per s)")
    return f"since the squeeze ({span:.0f}s): " + "; ".join(parts)


# ---------------------------------------------------------------- shared


def poll_until(client: MonitorClient, job_id: str, timeout: float, allowed: Allowed, *, done: Callable[[dict], bool],
               what: str, context: Callable[[], str]) -> tuple[dict, list[dict]]:
    """Poll the job's answer until ``done(answer)``; fails at the first answer ``allowed`` refuses, or
    at the deadline, showing the verdicts seen in order. -> (the answer, every answer seen)."""
    seen: list[dict] = []
    end = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if job is not None:
            seen.append(job)
            if not allowed(job["verdict"], tuple(sorted(job["culprit_ranks"]))):
                pytest.fail(f"waiting for {what}: alarm {job['verdict']} {job['culprit_ranks']}; verdicts seen in "
                            f"order: {sequence(seen)}\n{compact(job)}\n{context()}", pytrace=False)
            if done(job):
                return job, seen
        if time.monotonic() >= end:
            last = seen[-1] if seen else None
            pytest.fail(f"no {what} within {timeout:.0f}s; verdicts seen in order: {sequence(seen)}\n"
                        f"last answer:\n{compact(last)}\n{rank_cpu(last)}\n{context()}", pytrace=False)
        time.sleep(0.5)


def rank_cpu(job: dict | None) -> str:
    """The ranks' CPU figures in an answer (levels, run-queue wait, throttling: whatever it has)."""
    words = ("cpu", "run_queue", "denied", "throttl")
    return "ranks' CPU figures: " + "; ".join(
        f"rank {r.get('rank')}: {({k: v for k, v in r.items() if any(w in k for w in words)})}"
        for r in (job or {}).get("ranks", []))


def watch(client: MonitorClient, job: Job, seconds: float, poll: float = 0.5) -> list[dict | None]:
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert not job.finished(), f"the job ended early:\n{job.log_tail()}"
        seen.append(client.job(job.job_id))
        time.sleep(poll)
    return seen


def sequence(answers: list[dict]) -> list[str]:
    """The verdicts in order, repeats folded: ``['healthy x12', 'stalled [] x3', ...]``."""
    out: list[list] = []
    for j in answers:
        key = j["verdict"] + (f" {sorted(j['culprit_ranks'])}" if j["culprit_ranks"] or j["verdict"] != "healthy" else "")
        if out and out[-1][0] == key:
            out[-1][1] += 1
        else:
            out.append([key, 1])
    return [f"{k} x{n}" for k, n in out]


STEP_LINE = re.compile(r"^(?:\[rank\d+\]:)?step (\d+)/\d+ \| loss \S+ \| dt ([\d.]+)s", re.M)


def last_step(job: Job) -> int:
    steps = [int(m.group(1)) for m in STEP_LINE.finditer(job.text())]
    return steps[-1] if steps else 0


def step_times(job: Job, **phases: tuple[int, int | None]) -> str:
    """Median step time (rank 0's own ``dt``) over each phase's steps, ``name=(first, last or None)``."""
    dts = {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(job.text())}
    parts = []
    for name, (first, last) in phases.items():
        d = [dt for step, dt in dts.items() if step >= first and (last is None or step <= last)]
        parts.append(f"{name} {statistics.median(d):.3f}s ({len(d)} steps)" if d else f"{name} (no step)")
    return "step times (rank 0's dt, median): " + ", ".join(parts)
