"""A node speaks only for its own ranks (monitor.rank_claims): MonitorState fed reports from two
nodes, table-style; the real monitor with node-bound tokens in tests/monitor/test_auth.py."""

from __future__ import annotations

import pytest
from monitor_reports import rank, report

from monitor.ingest.rank_claims import CONFLICTS_KEPT
from monitor.ingest.state import MonitorState
from monitor.ingest.tracks import NODE_FRESH_S
from monitor.ingest.wire import Report

T0 = 1_700_000_000.0


def post(state: MonitorState, node: str, at: float, *ranks: dict) -> None:
    state.apply(Report.model_validate(report(node=node, ranks=list(ranks), sent_at=at)), at)


def rank_on(node: str, rank_no: int = 1, **fields) -> dict:
    pid = 2000 + rank_no if node == "node-b" else 5000 + rank_no
    return rank(job_id="job-x", rank=rank_no, pid=pid, **fields)


# (what node-b says of its rank 1 before node-a claims it, seconds until node-a's claim) ->
# whose rank 1 is then.
CASES = {
    "node-b runs it and reports: node-a's claim is refused": ({}, 1.0, "node-b"),
    "node-b said it ended: the rank moved (an elastic restart)": ({"alive": False}, 1.0, "node-a"),
    "node-b went silent: the rank was launched elsewhere": ({}, NODE_FRESH_S + 1, "node-a"),
}


@pytest.mark.parametrize("held,after_s,owner", CASES.values(), ids=CASES.keys())
def test_whose_rank_it_is(held: dict, after_s: float, owner: str) -> None:
    state = MonitorState()
    post(state, "node-b", T0, rank(job_id="job-x", rank=0, pid=2000), rank_on("node-b", **held))
    post(state, "node-a", T0 + after_s, rank_on("node-a"))
    job = state.jobs["job-x"]
    assert job.ranks[1].node == owner
    refused = owner == "node-b"
    assert state.claims_refused == int(refused)
    assert (1 in job.claim_conflicts) is refused


def test_a_claim_on_its_own_node_and_a_new_rank_are_taken() -> None:
    state = MonitorState()
    post(state, "node-b", T0, rank_on("node-b", 0))
    post(state, "node-a", T0 + 1, rank_on("node-a", 1))  # a rank nobody held
    post(state, "node-b", T0 + 2, rank_on("node-b", 0, cpu_percent=1.0))  # node-b's own, again
    job = state.jobs["job-x"]
    assert (job.ranks[0].node, job.ranks[1].node, state.claims_refused) == ("node-b", "node-a", 0)


def test_a_refused_claim_leaves_the_rank_as_its_node_reported_it() -> None:
    state = MonitorState()
    post(state, "node-b", T0, rank_on("node-b", cpu_percent=0.5, cpu_seconds=40.0))
    for i in range(3):
        post(state, "node-a", T0 + 1 + i, rank_on("node-a", cpu_percent=99.0, cpu_seconds=90.0 + i))
    job = state.jobs["job-x"]
    track = job.ranks[1]
    assert (track.node, track.pid, track.latest.cpu_percent) == ("node-b", 2001, 0.5)
    conflict = job.claim_conflicts[1]
    assert (conflict.claimed_by, conflict.held_by, conflict.refused) == ("node-a", "node-b", 3)
    assert (conflict.first_at, conflict.last_at) == (T0 + 1, T0 + 3)
    assert ("job-x", 1) not in state.nodes["node-a"].rank_keys


def test_the_conflict_goes_once_the_claim_is_taken() -> None:
    state = MonitorState()
    post(state, "node-b", T0, rank_on("node-b"))
    post(state, "node-a", T0 + 1, rank_on("node-a"))
    assert 1 in state.jobs["job-x"].claim_conflicts
    post(state, "node-b", T0 + 2, rank_on("node-b", alive=False, exit={"at": T0 + 1.5, "code": -15, "source": "proc"}))
    post(state, "node-a", T0 + 3, rank_on("node-a"))
    job = state.jobs["job-x"]
    assert job.ranks[1].node == "node-a" and job.claim_conflicts == {}


def test_conflicts_kept_per_job_are_bounded() -> None:
    state = MonitorState()
    ranks = range(CONFLICTS_KEPT + 20)
    post(state, "node-b", T0, *(rank_on("node-b", r, world_size=len(ranks)) for r in ranks))
    post(state, "node-a", T0 + 1, *(rank_on("node-a", r, world_size=len(ranks)) for r in ranks))
    job = state.jobs["job-x"]
    assert len(job.claim_conflicts) == CONFLICTS_KEPT
    assert state.claims_refused == len(ranks)
    assert all(t.node == "node-b" for t in job.ranks.values())


# What node-a says of a rank of node-b's 2-rank job: every one is refused, why in the conflict.
WORLD_CASES = {
    "rank 2 of 2, said to have failed": ({"rank_no": 2, "world_size": 3, "alive": False, "exit_code": 1},
                                         "past the world size 2 that"),
    "rank 2 alive, claiming a world of 3": ({"rank_no": 2, "world_size": 3}, "past the world size 2 that"),
    "rank 5 of its own world of 2": ({"rank_no": 5}, "past the world size 2 its own entry gives"),
    "rank 1, which node-b runs": ({"rank_no": 1}, ""),
}


@pytest.mark.parametrize("claim,reason", WORLD_CASES.values(), ids=WORLD_CASES.keys())
def test_a_rank_past_the_world_another_node_reports_is_refused(claim: dict, reason: str) -> None:
    state = MonitorState()
    post(state, "node-b", T0, rank_on("node-b", 0), rank_on("node-b", 1))
    fields = dict(claim)
    rank_no = fields.pop("rank_no")
    exit_code = fields.pop("exit_code", None)
    if exit_code is not None:
        fields["exit"] = {"at": T0, "code": exit_code}
    post(state, "node-a", T0 + 1, rank_on("node-a", rank_no, **fields))
    job = state.jobs["job-x"]
    assert sorted(job.ranks) == [0, 1] and all(t.node == "node-b" for t in job.ranks.values())
    assert job.claim_conflicts[rank_no].claimed_by == "node-a"
    assert job.claim_conflicts[rank_no].reason.startswith(reason)


def test_the_world_bound_follows_an_elastic_resize() -> None:
    """node-b's 2-rank workers end; a 4-rank world starts over node-b and node-a: ranks 2, 3 taken."""
    state = MonitorState()
    post(state, "node-b", T0, rank_on("node-b", 0), rank_on("node-b", 1))
    post(state, "node-b", T0 + 1, rank_on("node-b", 0, alive=False), rank_on("node-b", 1, alive=False))
    post(state, "node-a", T0 + 2, *(rank_on("node-a", r, world_size=4) for r in (2, 3)))
    job = state.jobs["job-x"]
    assert {r: t.node for r, t in job.ranks.items() if t.alive} == {2: "node-a", 3: "node-a"}
    assert job.claim_conflicts == {}


def test_the_world_bound_holds_while_a_node_owes_its_full_report() -> None:
    """After a restart a node is ``partial`` (not the present) until its full report: its ranks still
    bound the world, and the bound moves to another node when the one that vouched goes silent."""
    state = MonitorState()
    post(state, "node-b", T0, rank_on("node-b", 0), rank_on("node-b", 1))
    post(state, "node-c", T0, rank(job_id="job-x", rank=2, pid=7002, world_size=3))
    state.nodes["node-b"].partial = state.nodes["node-c"].partial = True
    post(state, "node-a", T0 + 1, rank_on("node-a", 3, world_size=4))
    job = state.jobs["job-x"]
    assert job.claim_conflicts[3].reason.startswith("past the world size 2 that node node-b")
    # node-b silent, node-c still heard: the smallest world heard lately bounds it now.
    post(state, "node-c", T0 + NODE_FRESH_S + 1, rank(job_id="job-x", rank=2, pid=7002, world_size=3))
    post(state, "node-a", T0 + NODE_FRESH_S + 2, rank_on("node-a", 4, world_size=8))
    assert job.claim_conflicts[4].reason.startswith("past the world size 3 that node node-c")
