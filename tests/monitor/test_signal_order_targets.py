"""What a signal order names, and when none is ordered (monitor/engine/actions/orders.py, engine.py): an
order carries the job as the culprit's node spelled it, and a node that reports one pid as two
ranks gets no order on its word about that pid. No I/O beyond a store; the live loop with the real
agent is tests/monitor/test_forged_signal_order_live.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from monitor_reports import rank, report

from monitor.engine.actions.config import ActionConfig, ActionRule
from monitor.engine.actions.engine import ActionEngine
from monitor.engine.actions.orders import AgentOrders, ReportedPids
from monitor.engine.actions.policy import Culprit, JobFacts
from monitor.ingest.state import MonitorState
from monitor.storage.store import Store
from monitor.ingest.wire import Report

T0 = 1_700_000_000.0
SIGNAL = ActionRule("stop-culprits", frozenset({"rank_stopped"}), 0.0, "signal", signal="SIGUSR1")


def _state(*reports: tuple[str, list[dict[str, Any]]]) -> MonitorState:
    state = MonitorState()
    for at, (node, ranks) in enumerate(reports):
        state.apply(Report.model_validate(report(node=node, ranks=ranks, sent_at=T0 + at)), T0 + at)
    return state


@pytest.mark.parametrize(("name", "reports", "said"), [
    ("one pid as ranks of two jobs",
     [("node-a", [rank("job-s", 1, pid=2001), rank("job-t", 0, pid=2001)])],
     "node node-a reports pid 2001 as rank 1 of job job-s and as rank 0 of job job-t: "
     "one process is one rank of one job, so it is lying about one of them"),
    ("one pid as two ranks of one job",
     [("node-a", [rank("job-s", 0, pid=2001), rank("job-s", 1, pid=2001)])],
     "node node-a reports pid 2001 as rank 1 of job job-s and as rank 0 of job job-s"),
    ("the same pid on another node is another process (its own pid namespace)",
     [("node-a", [rank("job-s", 1, pid=2001)]), ("node-b", [rank("job-t", 0, pid=2001)])],
     None),
    ("an ended rank's pid, given again by the kernel, is no lie",
     [("node-a", [rank("job-s", 1, pid=2001),
                  rank("job-t", 0, pid=2001, alive=False, exit={"at": T0, "code": 1, "source": "proc"})])],
     None),
    ("only the node's latest report counts: a rank it no longer lists is not its word now",
     [("node-a", [rank("job-t", 0, pid=2001)]), ("node-a", [rank("job-s", 1, pid=2001)])],
     None),
])
def test_a_node_that_reports_one_pid_as_two_ranks_is_not_trusted_on_that_pid(
        name: str, reports: list, said: str | None) -> None:
    state = _state(*reports)
    conflict = ReportedPids(state.nodes, state.jobs).conflict("node-a", "job-s", 1, 2001)
    assert conflict == said if said is None else conflict is not None and conflict.startswith(said), conflict


def test_a_culprit_without_a_live_pid_has_nothing_to_doubt() -> None:
    state = _state(("node-a", [rank("job-s", 1, pid=2001), rank("job-t", 0, pid=2001)]))
    assert ReportedPids(state.nodes, state.jobs).conflict("node-a", "job-s", 1, None) is None
    assert ReportedPids(state.nodes, state.jobs).conflict("node-gone", "job-s", 1, 2001) is None


def _engine(store: Store, dry_run: bool = False) -> tuple[ActionEngine, AgentOrders]:
    orders = AgentOrders()
    return ActionEngine(ActionConfig((SIGNAL,), dry_run=dry_run), store, orders, clock=lambda: T0), orders


def _act(engine: ActionEngine, *culprits: Culprit) -> None:
    engine.observe(JobFacts("job-s", "rank_stopped", "rank 1 stopped", culprits), T0)

    async def run() -> None:
        async with httpx.AsyncClient() as client:
            await engine.run_pending(client)
    asyncio.run(run())


def test_an_order_names_the_job_as_the_culprits_node_spelled_it(store: Store) -> None:
    engine, orders = _engine(store)
    # The monitor keeps the job as "job-s"; node-b reported the rank under another spelling of it.
    _act(engine, Culprit(1, "node-b", 4242, 100.0, "node-b.cluster:29500"), Culprit(0, "node-a", 4141, 99.0))
    [order_b] = orders.take("node-b")
    assert {k: order_b[k] for k in ("signal", "job_id", "rank", "pid", "started_at")} == \
        {"signal": "SIGUSR1", "job_id": "node-b.cluster:29500", "rank": 1, "pid": 4242, "started_at": 100.0}
    # A culprit that does not say how its node spelled the job is named by the job's own id.
    [order_a] = orders.take("node-a")
    assert order_a["job_id"] == "job-s"


@pytest.mark.parametrize(("dry_run", "outcome", "detail"), [
    (False, "unattributed", "no SIGUSR1 ordered: node node-a reports pid 2001 as two ranks"),
    (True, "unattributed", "no SIGUSR1 ordered: node node-a reports pid 2001 as two ranks"),  # a dry run says so too
])
def test_no_signal_is_ordered_on_a_pid_its_node_reports_as_two_ranks(
        store: Store, dry_run: bool, outcome: str, detail: str) -> None:
    engine, orders = _engine(store, dry_run=dry_run)
    _act(engine, Culprit(0, "node-b", 4242, 100.0, "job-s"),
         Culprit(1, "node-a", 2001, 100.0, "job-s", pid_conflict="node node-a reports pid 2001 as two ranks"))
    [entry] = engine.audit("job-s")
    assert (entry.outcome, entry.detail) == (outcome, detail)
    # Not even to the other culprit's node: the action is one decision, taken on the node's word.
    assert orders.take("node-a") == [] and orders.take("node-b") == []
