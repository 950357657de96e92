"""Fail-slow, table-style: a job that steps at a fraction of its own pace (diagnosis.slow_network) and a rank
starved of CPU (diagnosis.denied_cpu). Pure: JobViews in, verdicts out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from monitor.diagnosis import JobView, Socket, diagnose
from monitor.diagnosis.model import HostFacts, Interface, PaceView
from tests.diagnosis.builders import NOW, collective, computing, job, rank, steps

SLOW_STEPS = steps(NOW - 1, 12.5, count=8)  # a step every 12.5 s, the last a second ago
FAST_STEPS = steps(NOW - 0.5, 1.0, count=60)
# At its best the job made progress every 0.17 s; for the last 40 s, every 12.5 s.
SLOW = PaceView(baseline_s=0.17, now_s=12.5, ratio=73.5, slow_since=NOW - 40, goodput=0.4, settled_at=NOW - 300)
STEADY = PaceView(baseline_s=1.0, now_s=1.05, ratio=1.05, goodput=0.97, settled_at=NOW - 300)
SLOWER = PaceView(baseline_s=1.0, now_s=2.2, ratio=2.2, goodput=0.6, settled_at=NOW - 300)
HOSTS = {"node-a": HostFacts(interfaces=(Interface("eth0", ("10.0.0.20",)),)),
         "node-b": HostFacts(interfaces=(Interface("eth0", ("10.0.0.10",)),))}


def link(local: str, remote: str, rtt: float, low: float, retrans: float = 0.0, queued: int = 0) -> Socket:
    return Socket(local, remote, "ESTABLISHED", NOW - 100, rtt_ms=rtt, min_rtt_ms=low, retrans_per_s=retrans,
                  send_queue_bytes=queued)


THROTTLED = (link("10.0.0.20:41000", "10.0.0.10:52000", 240.0, 0.08, 2.5, 900_000),)
THROTTLED_B = (link("10.0.0.10:52000", "10.0.0.20:41000", 230.0, 0.07, 1.0),)
FINE = (link("10.0.0.20:41000", "10.0.0.10:52000", 0.3, 0.08),)
FINE_B = (link("10.0.0.10:52000", "10.0.0.20:41000", 0.3, 0.07),)


def waiting_job(pace: PaceView | None = SLOW, sockets=(THROTTLED, THROTTLED_B), progress=SLOW_STEPS,
                stack_at: float = NOW - 2, **kw) -> JobView:
    """Two ranks on two nodes, parked in all_reduce (their latest stacks), the job still stepping."""
    ranks = [rank(r, cpu=3.0, frames=collective("all_reduce", 50), stack_at=stack_at, node=node,
                  sockets=socks, collective_wait_share=0.9, cpu_level_percent=3.0, progress=progress)
             for r, (node, socks) in enumerate(zip(("node-a", "node-b"), sockets))]
    return job(*ranks, pace=pace, hosts=HOSTS, **kw)


def starved(values: list[tuple[float, float | None]], pace: PaceView | None = SLOWER, **extra) -> JobView:
    """Ranks computing every step, with (CPU level, run-queue wait level) each."""
    ranks = [rank(r, cpu=cpu, cpu_level_percent=cpu, run_queue_wait_level_percent=runq, frames=computing(),
                  active=True, state="R", **extra) for r, (cpu, runq) in enumerate(values)]
    return job(*ranks, progress=FAST_STEPS, pace=pace)


CASES: list[tuple[str, JobView, str, tuple[int, ...]]] = [
    ("links throttled: 1/73 of its pace, ranks in all_reduce, the link queueing",
     waiting_job(), "slow_network", ()),
    ("the same, no tcp_info: still slow_network, said so",
     waiting_job(sockets=((), ())), "slow_network", ()),
    ("a third of the pace but the ranks compute (not waiting): no slow_network",
     job(*(rank(r, cpu=95.0, frames=computing(), active=True, state="R", progress=SLOW_STEPS) for r in (0, 1)),
         pace=SLOW), "healthy", ()),
    ("slow stretch holding a checkpoint phase: its own pace",
     waiting_job(phase_marks=((NOW - 30, "checkpoint"),)), "healthy", ()),
    ("no settled pace (slow from the first step): healthy",
     waiting_job(pace=None), "healthy", ()),
    ("at its pace: healthy",
     waiting_job(pace=STEADY, sockets=(FINE, FINE_B), progress=FAST_STEPS), "healthy", ()),
    ("stacks older than the slow stretch, share low: not known to wait",
     replace(waiting_job(stack_at=NOW - 200),
             ranks=tuple(replace(r, collective_wait_share=0.1) for r in waiting_job(stack_at=NOW - 200).ranks)),
     "healthy", ()),
    ("rank 1 squeezed beside busy neighbours: waits for a core 72% of the time",
     starved([(37.0, 2.0), (25.0, 72.0)]), "straggler", (1,)),
    ("one of eight ranks squeezed",
     starved([(60.0, 3.0)] * 5 + [(30.0, 65.0)] + [(60.0, 4.0)] * 2), "straggler", (5,)),
    ("the whole node oversubscribed alike: no straggler",
     starved([(40.0, 55.0), (41.0, 58.0), (40.0, 57.0), (39.0, 60.0)]), "healthy", ()),
    ("a little run-queue wait on a busy machine: no straggler",
     starved([(45.0, 8.0), (44.0, 21.0)]), "healthy", ()),
    ("squeezed beside other busy work: its peer waits 29%, it 52%",
     starved([(37.0, 29.0), (24.0, 52.0)]), "straggler", (1,)),
    ("squeezed, but the job at its usual pace (denied from the start): no straggler",
     starved([(37.0, 2.0), (25.0, 72.0)], pace=STEADY), "healthy", ()),
    ("no settled pace: no straggler by denial",
     starved([(37.0, 2.0), (25.0, 72.0)], pace=None), "healthy", ()),
]


@pytest.mark.parametrize(("name", "view", "verdict", "culprits"), CASES, ids=[c[0] for c in CASES])
def test_fail_slow_table(name: str, view: JobView, verdict: str, culprits: tuple[int, ...]) -> None:
    found = diagnose(view)
    assert (found.verdict, found.culprit_ranks) == (verdict, culprits), found.summary


def test_slow_network_names_the_link_the_pace_and_the_numbers() -> None:
    found = diagnose(waiting_job())
    assert "the link node-a <-> node-b is slow" in found.summary, found.summary
    assert "1/73.5 of its pace" in found.summary
    text = "\n".join(found.evidence)
    assert "progress every 12.50s against 0.17s at its best" in text
    assert "slow link node-a <-> node-b (2 connections): round trip 240.0 ms against 0.07 ms at its lowest, " \
           "3.5 retransmits/s, 0.9 MB waiting to be sent" in text, text
    assert found.since == NOW - 40


def test_slow_network_says_when_no_socket_shows_the_loss() -> None:
    quiet = diagnose(waiting_job(sockets=(FINE, FINE_B)))
    assert quiet.verdict == "slow_network" and "slow communication" in quiet.summary
    assert any("show no queueing or loss" in e for e in quiet.evidence), quiet.evidence
    blind = diagnose(waiting_job(sockets=((), ())))
    assert any("no socket of the job's ranks gave tcp_info" in e for e in blind.evidence), blind.evidence


def test_bytes_moving_in_a_collective_past_the_step_is_slow_network_with_the_link() -> None:
    """Between two slow steps (before the first one ends): parked in all_reduce, still sending."""
    view = waiting_job(pace=replace(SLOW, slow_since=None, now_s=0.17, ratio=1.0), progress=FAST_STEPS[:-5])
    ranks = tuple(replace(r, write_bytes_per_s=500_000.0, idle_since=NOW - 8) for r in view.ranks)
    found = diagnose(replace(view, ranks=ranks))
    assert found.verdict == "slow_network", found.summary
    assert "bytes still move" in found.summary and "node-a <-> node-b" in found.summary


def test_a_healthy_job_slower_than_usual_says_so_and_what_was_checked() -> None:
    found = diagnose(waiting_job(pace=SLOWER, sockets=(FINE, FINE_B), progress=FAST_STEPS))
    assert found.verdict == "healthy"
    assert "slower than usual (progress every 2.20s against 1.00s at its best: 1/2.2 of its pace)" in found.summary
    assert "run-queue wait" in found.summary


def test_a_starved_rank_is_told_by_its_run_queue_and_quota() -> None:
    view = starved([(37.0, 2.0), (25.0, 72.0)], pace=SLOWER)
    ranks = (view.ranks[0], replace(view.ranks[1], cpu_throttled_level_percent=10.0, cgroup="/kubepods/pod1"))
    found = diagnose(replace(view, ranks=ranks))
    assert found.verdict == "straggler" and found.culprit_ranks == (1,)
    assert "rank 1 is starved of CPU" in found.summary and "82%" in found.summary, found.summary
    assert ("rank 1 on node-a: waited in the run queue for a CPU 72% of the time and its cgroup /kubepods/pod1 "
            "was throttled by its CPU quota 10% of the time, using 25% CPU") in found.evidence[0]
    assert any("1/2.2 of its best pace" in e for e in found.evidence)


def test_uneven_denial_keeps_cpu_levels_from_naming_the_waiting_rank() -> None:
    """Rank 0 shows more CPU than the starved rank 1 (it waits less for work it cannot do): by CPU levels
    alone rank 0 would be the straggler. With rank 1 denied CPU unevenly, levels are not compared."""
    found = diagnose(starved([(40.0, 2.0), (26.0, 24.0)]))
    assert found.verdict == "healthy", found.summary
    by_cpu_alone = diagnose(starved([(40.0, None), (26.0, None)]))
    assert (by_cpu_alone.verdict, by_cpu_alone.culprit_ranks) == ("straggler", (0,))


def gpu_ranks(*gpus: tuple[int, tuple[str, ...]]) -> JobView:
    """GPU ranks stepping (their CPU spins in NCCL), each with (SM clock, NVML slowdown reasons)."""
    ranks = [rank(r, cpu=100.0, cpu_level_percent=100.0, frames=computing(), active=True, state="R",
                  gpu_utilization_percent=99.0, gpu_sm_clock_mhz=mhz, gpu_max_sm_clock_mhz=1980,
                  gpu_slowdown_reasons=reasons, node=f"gpu-node-{r // 8}") for r, (mhz, reasons) in enumerate(gpus)]
    return job(*ranks, progress=FAST_STEPS)


FULL = (1980, ())
GPU_CASES: list[tuple[str, JobView, str, tuple[int, ...]]] = [
    ("one GPU of eight held down by a thermal slowdown", gpu_ranks(*[FULL] * 3, (1050, ("hw_thermal_slowdown",)),
                                                                   *[FULL] * 4), "straggler", (3,)),
    ("a GPU at a lower clock with no slowing reason (its own boost table): not named",
     gpu_ranks(*[FULL] * 7, (1500, ())), "healthy", ()),
    ("every GPU power-capped alike: the room, not a rank",
     gpu_ranks(*[(1400, ("sw_power_cap",))] * 8), "healthy", ()),
    ("a GPU held down a little (within 15% of its peers)", gpu_ranks(*[FULL] * 7, (1800, ("sw_power_cap",))),
     "healthy", ()),
]


@pytest.mark.parametrize(("name", "view", "verdict", "culprits"), GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_clocks_table(name: str, view: JobView, verdict: str, culprits: tuple[int, ...]) -> None:
    found = diagnose(view)
    assert (found.verdict, found.culprit_ranks) == (verdict, culprits), found.summary


def test_a_throttled_gpu_is_told_by_its_clock_and_nvmls_reason() -> None:
    found = diagnose(gpu_ranks(*[FULL] * 3, (1050, ("hw_thermal_slowdown", "sw_power_cap")), *[FULL] * 4))
    assert found.summary == "rank 3 sets the job's pace: its GPU held down to 1050 MHz against 1980 MHz on the others"
    assert found.evidence[0] == ("rank 3 on gpu-node-0: its GPU at 1050 MHz of 1980 MHz, held down by NVML's "
                                 "hardware thermal slowdown, power cap")
