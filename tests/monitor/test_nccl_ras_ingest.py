"""NCCL's RAS answers through the real app: ingest (full and delta), limits, the join of the
nodes' parts, and /diagnose naming the rank NCCL's counts point at.

The answers are NCCL's recorded ones (tests/fixtures/nccl), cut to each node's ranks by the
agent's own code, as the agent sends them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from monitor_reports import progress, rank, report
from monitor_testkit import FakeClock, TestClient, assert_refused, job_answer, monitor_of, post_report

from agent.nccl_ras_answer import local_view, parse_status
from agent.stacks import parse_dump
from monitor.ingest import wire
from monitor.ingest.fastwire import _decoder

URL = "/api/v1/reports"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
PIDS = {"mismatch": (445, 446, 447), "idle_rank1": (534, 535)}


def nccl_ras(case: str, pids: tuple[int, ...], polled_at: float) -> dict[str, Any]:
    """The agent's ``nccl_ras`` for a node running the ranks with ``pids``."""
    parsed = parse_status((FIXTURES / f"ras-{case}.json").read_text())
    return {"polled_at": polled_at, "unchanged_since": polled_at - 10, "status": "ok",
            "address": "localhost:28028", "nccl_version": parsed["nccl_version"],
            "communicators": local_view(parsed, {pid: pid for pid in pids})}


def spinning_rank(case: str, r: int, now: float, world_size: int) -> dict[str, Any]:
    """Rank ``r`` stuck in cudaStreamSynchronize (NCCL's recorded dump), steps stopped 12 s ago."""
    pid = PIDS[case][r]
    threads = parse_dump((FIXTURES / f"pyspy-{case}-native.json").read_text(), PIDS[case][0])
    points = [(now - 12 - 0.5 * i, 100 - i) for i in reversed(range(16))]
    return rank(job_id="gpu-job", rank=r, world_size=world_size, pid=pid, cpu_percent=100.0, state="R",
                progress=progress(100, 100, points),
                stack={"taken_at": now - 1, "native": True, "duration_s": 0.2, "threads": threads},
                gpus=[{"index": 0, "utilization_percent": 100.0}])


post = post_report


def diagnosis_of(client: TestClient, job_id: str = "gpu-job") -> dict[str, Any]:
    return job_answer(client, job_id)


def test_diagnose_names_the_rank_with_the_extra_broadcast(client: TestClient, clock: FakeClock) -> None:
    ranks = [spinning_rank("mismatch", r, clock.now, 3) for r in range(3)]
    post(client, report(ranks=ranks, sent_at=clock.now, nccl_ras=nccl_ras("mismatch", PIDS["mismatch"], clock.now - 1)))
    job = diagnosis_of(client)
    assert job["verdict"] == "deadlock" and job["culprit_ranks"] == [0], job["summary"]
    assert "NCCL RAS: rank 0 issued Broadcast #1 that no other rank issued" in job["evidence"]
    assert job["hints"][0].startswith("rank 0 issued a Broadcast the others did not")


def test_the_parts_of_two_nodes_are_joined(client: TestClient, clock: FakeClock) -> None:
    # Rank 0 on node-a, rank 1 on node-b: each agent sends only its own rank's counts.
    for node, r in (("node-a", 0), ("node-b", 1)):
        only = (PIDS["idle_rank1"][r],)
        post(client, report(node=node, ranks=[spinning_rank("idle_rank1", r, clock.now, 2)], sent_at=clock.now,
                            nccl_ras=nccl_ras("idle_rank1", only, clock.now - 1)))
    [result] = monitor_of(client).results()
    [comm] = result.view.nccl
    assert [(r.rank, r.node, r.pid, dict(r.counts)) for r in comm.ranks] == [
        (0, "node-a", 534, {"AllReduce": 64}), (1, "node-b", 535, {"AllReduce": 60})]
    job = diagnosis_of(client)
    assert job["verdict"] == "deadlock" and job["culprit_ranks"] == [1], job["summary"]
    assert "NCCL RAS: rank 1 stopped at AllReduce 60 while rank 0 launched up to 64" in job["evidence"]


def test_another_jobs_communicators_are_not_this_jobs(client: TestClient, clock: FakeClock) -> None:
    ranks = [spinning_rank("mismatch", r, clock.now, 3) for r in range(3)]
    other = nccl_ras("idle_rank1", PIDS["idle_rank1"], clock.now - 1)  # pids of no rank of this job
    post(client, report(ranks=ranks, sent_at=clock.now, nccl_ras=other))
    [result] = monitor_of(client).results()
    assert result.view.nccl == ()
    assert diagnosis_of(client)["culprit_ranks"] == []


def test_a_delta_keeps_the_answer_a_full_report_without_one_drops_it(client: TestClient, clock: FakeClock) -> None:
    answer = nccl_ras("mismatch", PIDS["mismatch"], clock.now - 1)
    post(client, report(ranks=[rank(pid=445)], sent_at=clock.now + 5, nccl_ras=answer))  # the agent's clock 5 s ahead
    node = monitor_of(client)._state.nodes["node-a"]
    assert node.nccl_ras is not None
    assert (node.nccl_ras.polled_at, node.nccl_ras.unchanged_since) == (clock.now - 6, clock.now - 16)
    clock.advance(1)
    assert post(client, report(ranks=[rank(pid=445)], sent_at=clock.now, host=None, nccl_ras=None,
                               delta=True))["delta"] is True
    assert monitor_of(client)._state.nodes["node-a"].nccl_ras is node.nccl_ras
    clock.advance(1)
    post(client, report(ranks=[rank(pid=445)], sent_at=clock.now))
    assert monitor_of(client)._state.nodes["node-a"].nccl_ras is None


def test_both_decoders_read_an_answer_alike() -> None:
    body = report(nccl_ras=nccl_ras("mismatch", PIDS["mismatch"], 10.0))
    raw = json.dumps(body).encode()
    fast = _decoder.decode(raw)  # the fast path itself
    slow = wire.Report.model_validate_json(raw)
    assert json.loads(msgspec.json.encode(fast)) == json.loads(slow.model_dump_json())
    assert fast.nccl_ras.communicators[0].ranks[0].collective_counts == {"Broadcast": 1, "AllReduce": 64}


def _comm(**fields: Any) -> dict[str, Any]:
    return {"hash": "0x1", "size": 2, "ranks": [{"rank": 0, "pid": 445}], **fields}


@pytest.mark.parametrize(
    ("ras", "field"),
    [
        ({"polled_at": 1.0, "communicators": [_comm()] * 65}, "nccl_ras.communicators"),
        ({"polled_at": 1.0, "communicators": [_comm(size=0)]}, "nccl_ras.communicators.0.size"),
        ({"polled_at": 1.0, "communicators": [_comm(hash="0x" + "f" * 70)]}, "nccl_ras.communicators.0.hash"),
        ({"polled_at": 1.0, "communicators": [_comm(ranks=[{"rank": -1, "pid": 1}])]},
         "nccl_ras.communicators.0.ranks.0.rank"),
        ({"polled_at": 1.0, "communicators": [_comm(ranks=[{"rank": 0, "pid": 1, "collective_counts": {
            f"Kind{i}": i for i in range(17)}}])]}, "nccl_ras.communicators.0.ranks.0.collective_counts"),
        ({"polled_at": 1.0, "communicators": [_comm(missing_ranks=[{"rank": 1}] * 65)]},
         "nccl_ras.communicators.0.missing_ranks"),
        ({"communicators": []}, "nccl_ras.polled_at"),
    ],
)
def test_limits_hold_and_name_the_field(client: TestClient, ras: dict[str, Any], field: str) -> None:
    assert_refused(client, json.dumps(report(nccl_ras=ras)).encode(), field)
