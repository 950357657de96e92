"""The views a pass reuses (monitor/engine/views.py, diagnosis/stacks.memo) are never stale: each kind of
change a report can bring shows in the next view, and stacks that share frames share answers only
where the answer depends on nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from monitor_reports import frame, progress, rank, report, socket, stack

from monitor.diagnosis import Frame, Stack
from monitor.diagnosis.stacks import wait_point
from monitor.ingest.rank_ingest import mark_vanished
from monitor.ingest.state import MonitorState
from monitor.engine.views import job_view
from monitor.ingest.wire import Report

T0 = 1_700_000_000.0


def apply(state: MonitorState, body: dict[str, Any], at: float) -> None:
    state.apply(Report.model_validate(body), at)


def rank0(state: MonitorState):  # noqa: ANN201 (a RankView)
    return job_view(state.jobs["job-a"], state.nodes, T0 + 100).ranks[0]


@pytest.mark.parametrize(("change", "read"), [
    ({"cpu_percent": 3.0}, lambda v: v.cpu_percent == 3.0),
    ({"state": "T"}, lambda v: v.proc_state == "T"),
    ({"env": {"MASTER_PORT": "29501"}}, lambda v: dict(v.env) == {"MASTER_PORT": "29501"}),
    ({"sockets": [socket("10.0.0.1:1", "10.0.0.2:2")]}, lambda v: [s.remote for s in v.sockets] == ["10.0.0.2:2"]),
    ({"log_errors": ["RuntimeError: boom"]}, lambda v: v.log_errors == ("RuntimeError: boom",)),
    ({"progress": progress(3, 3, [(T0 + 1.5, 3)])}, lambda v: v.progress_times[-1] == pytest.approx(T0 + 1.5)),
    ({"stack": stack(T0 + 1.5, frames=[frame("main", "/work/train.py", 7)])},
     lambda v: v.stack is not None and v.stack.frames[0].line == 7),
    ({"pid": 2000}, lambda v: v.pid == 2000),  # restarted by its launcher: a new track
    ({"alive": False}, lambda v: not v.alive),
])
def test_each_change_a_report_brings_shows_in_the_next_view(change: dict, read) -> None:  # noqa: ANN001
    state = MonitorState()
    apply(state, report(ranks=[rank(progress=progress(1, 1, [(T0 - 1, 1)]))], sent_at=T0), T0)
    before = rank0(state)
    assert rank0(state) is before  # nothing changed: the same view
    apply(state, report(ranks=[rank(**change)], sent_at=T0 + 2), T0 + 2)
    after = rank0(state)
    assert after is not before and read(after), after


def test_a_rank_that_vanished_shows_in_the_next_view() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank()], sent_at=T0), T0)
    assert rank0(state).alive
    mark_vanished(state.jobs["job-a"].ranks[0])
    assert not rank0(state).alive and rank0(state).exit is not None


BACKWARD = (Frame("_engine_run_backward", "/v/site-packages/torch/autograd/graph.py", 829),
            Frame("train_step", "/work/train.py", 60))


@pytest.mark.parametrize(("active", "cpu", "waits"), [
    (False, 90.0, True),  # py-spy saw it idle: waiting for DDP's reducer
    (True, 90.0, False),  # running at 90%: computing the backward pass
    (True, 5.0, True),  # running by py-spy but at 5% CPU: waiting
    (None, None, False),
])
def test_stacks_with_the_same_frames_share_an_answer_only_when_it_depends_on_nothing_else(
        active: bool | None, cpu: float | None, waits: bool) -> None:
    # The backward engine both computes and waits: the answer turns on `active` and on CPU, which
    # the shared memo must keep apart although the frames are the same.
    for _ in range(2):
        stack_ = Stack(taken_at=T0, frames=BACKWARD, active=active)
        assert (wait_point(stack_, cpu) is not None) == waits


def test_a_stack_that_arrives_after_its_step_teaches_its_wait_site_at_once() -> None:
    state = MonitorState()
    # Rank 0 stepped at T0+10 and was then dumped waiting (pending: taken after the step).
    apply(state, report(node="a", ranks=[rank(rank=0, progress=progress(10, 10, [(T0 + 10, 10)]),
                                              stack=stack(T0 + 10.1))], sent_at=T0 + 11), T0 + 11)
    assert state.jobs["job-a"].known_wait_sites == set()
    # Another node's stack, taken before that step, reaches the monitor after it.
    broadcast = [frame("broadcast", "/v/site-packages/torch/distributed/distributed_c10d.py", 2000),
                 frame("sync", "/work/train.py", 77)]
    apply(state, report(node="b", ranks=[rank(rank=1, stack=stack(T0 + 9.9, frames=broadcast))], sent_at=T0 + 11.5),
          T0 + 11.5)
    assert state.jobs["job-a"].known_wait_sites == {"broadcast@train.py:77"}
