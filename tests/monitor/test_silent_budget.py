"""monitor/ingest/silent_budget.py: what silent jobs and nodes keep, bounded; the densest forgotten first,
what reports never, and nothing while no agent at all reports."""

from __future__ import annotations

from typing import Any

from monitor_reports import rank, report

from monitor.ingest.silent_budget import SilentBudget, job_bytes
from monitor.ingest.state import MonitorState
from monitor.ingest.wire import Report

T0 = 1_700_000_000.0
SILENT_S = 60.0
PADDING = ["x" * 2048] * 10


def apply(state: MonitorState, node: str, job: str, at: float, ranks: int = 2, **fields: Any) -> None:
    body = report(node=node, ranks=[rank(job_id=job, rank=k, world_size=ranks, **fields) for k in range(ranks)],
                  sent_at=at)
    state.apply(Report.model_validate(body), at)


def flooded_state() -> MonitorState:
    """A real job whose node went silent, 20 padded junk jobs under new node names after it, and a
    node that goes on reporting."""
    state = MonitorState()
    apply(state, "node-dead", "job-dead", T0, ranks=8, log_errors=["RuntimeError: NCCL timeout"])
    for n in range(20):
        apply(state, f"junk-{n}", f"junk-{n}", T0 + 1 + n * 0.1, log_errors=PADDING)
    apply(state, "node-live", "job-live", T0 + 100)
    return state


def test_past_the_budget_padded_junk_goes_first_and_what_reports_stays() -> None:
    state = flooded_state()
    budget = SilentBudget(max_bytes=job_bytes(state.jobs["job-dead"]) + 4 * job_bytes(state.jobs["junk-0"]))
    forgotten = budget.enforce(state, T0 + 100, SILENT_S)
    assert len(forgotten) == 17 and all(j.startswith("junk-") for j in forgotten)
    assert {"job-dead", "job-live"} <= state.jobs.keys()
    assert len(state.jobs) == 5  # the real silent job, three junk jobs within the budget beside it, the live one
    assert "node-dead" in state.nodes and "node-live" in state.nodes


def test_under_the_budget_silent_jobs_stay() -> None:
    state = flooded_state()
    assert SilentBudget(max_bytes=64 * 1024 * 1024).enforce(state, T0 + 100, SILENT_S) == []
    assert len(state.jobs) == 22


def test_nothing_is_forgotten_while_no_agent_at_all_reports() -> None:
    state = flooded_state()
    # Every node silent: the monitor is the one cut off, and keeps its picture for when they are back.
    assert SilentBudget(max_bytes=1024).enforce(state, T0 + 100 + 2 * SILENT_S, SILENT_S) == []
    assert len(state.jobs) == 22


def test_a_silent_node_goes_only_after_its_jobs() -> None:
    state = flooded_state()
    SilentBudget(max_bytes=1024).enforce(state, T0 + 100, SILENT_S)
    assert set(state.jobs) == {"job-live"}
    # Past the budget with every silent job gone, their nodes go too; the live one stays.
    assert set(state.nodes) == {"node-live"}
