"""Bytes leaving a rank's socket queues are bytes moving, table-style through the real ingest.

A throttled link takes a collective's megabytes into the kernel's send buffer at once (one burst of
writes), then drains them for seconds with no new write: by its writes alone the rank sits idle in
all_reduce, and a step longer than the stall threshold read as a deadlock (seen under load in
tests/e2e/test_fail_slow.py). Its send queue says otherwise while it drains. A deadlocked rank's
queue stays empty, or full and still when its peer no longer reads: that is no movement.
"""

from __future__ import annotations

import pytest
from monitor_reports import progress, rank, report, socket, stack

from monitor.diagnosis import diagnose
from monitor.diagnosis.activity import MOVING_WINDOW_S
from monitor.engine.views import job_view
from monitor.ingest.state import MonitorState
from monitor.ingest.wire import Report

JOB = "job-a"
STEP_S = 0.1
SLOW_STEP_AT = 30.0  # the job steps every STEP_S until then; from then on its step takes long
WATCH_S = 20.0
# Readings after which bytes moved at the slow step's start (a queue filling) no longer count.
MOVING_SETTLED = int(MOVING_WINDOW_S) + 2
PEERS = {0: ("10.0.0.1:40000", "10.0.0.2:40001"), 1: ("10.0.0.2:40001", "10.0.0.1:40000")}


def queue_draining(t: float) -> int:
    """4 MB buffered at the slow step's start, 180 KB leaving each second (a 1.5 Mbit/s link)."""
    return max(0, 4_000_000 - int((t - SLOW_STEP_AT) * 180_000))


QUEUES = {
    "draining over a slow link": queue_draining,
    "empty (nothing to send)": lambda t: 0,
    "full and still (the peer stopped reading)": lambda t: 2_500_000,
    "a store heartbeat's few bytes, now and then": lambda t: 120 if int(t) % 3 == 0 else 0,
}


def node_report(node_rank: int, t: float, tx_queue: int) -> Report:
    steps = int(min(t, SLOW_STEP_AT) / STEP_S)
    recent = [(round(s * STEP_S, 3), s) for s in range(max(1, steps - 30), steps + 1)]
    parked = t >= SLOW_STEP_AT
    local, remote = PEERS[node_rank]
    body = rank(job_id=JOB, rank=node_rank, pid=1000 + node_rank, cpu_percent=0.5 if parked else 60.0,
                progress=progress(steps, steps, recent),
                stack=stack(t, active=False if parked else True),
                sockets=[socket(local, remote, tx_queue=tx_queue if parked else 0, rx_queue=0)])
    return Report.model_validate(report(node=f"node-{node_rank}", ranks=[body], sent_at=t))


def readings(queue) -> list[tuple[str, dict[int, str]]]:
    """(verdict, each rank's state) at each second of the slow step."""
    state = MonitorState()
    seen = []
    t = 0.0
    while t <= SLOW_STEP_AT + WATCH_S:
        for node_rank in (0, 1):
            state.apply(node_report(node_rank, t, queue(t)), t)
        if t >= SLOW_STEP_AT:
            found = diagnose(job_view(state.jobs[JOB], state.nodes, t))
            seen.append((found.verdict, {r.rank: r.state for r in found.ranks}))
        t += 1.0
    return seen


def test_a_queue_draining_is_sending_and_never_an_alarm() -> None:
    seen = readings(QUEUES["draining over a slow link"])
    assert all(verdict not in ("deadlock", "stalled") for verdict, _ in seen), seen
    assert all(states == {0: "sending", 1: "sending"} for _, states in seen[1:]), seen


@pytest.mark.parametrize("case", ["empty (nothing to send)", "full and still (the peer stopped reading)",
                                  "a store heartbeat's few bytes, now and then"])
def test_a_queue_that_moves_nothing_leaves_the_deadlock_named(case: str) -> None:
    seen = readings(QUEUES[case])
    assert seen[-1][0] == "deadlock", seen[-1]
    # A queue that filled as the step began moved bytes then (MOVING_WINDOW_S), never after.
    assert all(state != "sending" for _, states in seen[MOVING_SETTLED:] for state in states.values()), seen
