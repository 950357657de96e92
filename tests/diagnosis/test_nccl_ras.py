"""NCCL's own evidence in the verdict (monitor/diagnosis/nccl.py), table-style.

The rows are built from NCCL's recorded answers and py-spy dumps (tests/fixtures/nccl) along
the production path: the agent's parser and local view, the wire model, the monitor's join
of the nodes' parts into the job's communicators, then the diagnosis.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.nccl_ras_answer import local_view, parse_status
from agent.stacks import parse_dump
from monitor.diagnosis import JobView, diagnose
from monitor.diagnosis.model import NcclComm, NcclMissingRank, NcclRank
from monitor.diagnosis.nccl import ISSUED_ALONE, MAJORITY, STOPPED_FIRST, culprits_of, mismatches, missing
from monitor.engine.nccl_views import join_comms
from monitor.ingest.rank_ingest import to_stack
from monitor.ingest.tracks import NcclRasTrack
from monitor.ingest.wire import NcclRasReport, StackReport
from tests.diagnosis.builders import NOW, job, rank, sleeping, steps

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
STALLED = steps(NOW - 12, 0.5)  # steps that stopped 12 s ago
RUNNING = steps(NOW - 0.1, 0.1)
# The recorded pids of each scenario's ranks, in rank order.
PIDS = {"mismatch": (445, 446, 447), "idle_rank1": (534, 535), "exit_rank1": (601, 602)}


def ras(case: str, polled_at: float = NOW - 2, unchanged_for: float = 20.0, node: str = "node-a"
        ) -> tuple[NcclComm, ...]:
    """The job's communicators from NCCL's recorded answer, as the monitor builds them."""
    pids = {pid: pid for pid in PIDS[case]}
    comms = local_view(parse_status((FIXTURES / f"ras-{case}.json").read_text()), pids)
    answer = NcclRasReport.model_validate({"polled_at": 0.0, "communicators": comms})
    track = NcclRasTrack(polled_at, polled_at - unchanged_for, answer)
    return join_comms([(node, track)], {(node, pid): r for r, pid in enumerate(PIDS[case])}, {})


def spinning(case: str):
    """The recorded native dump of the scenario's rank 0: in cudaStreamSynchronize under .item()."""
    text = (FIXTURES / f"pyspy-{case}-native.json").read_text()
    threads = parse_dump(text, PIDS[case][0])
    return to_stack(StackReport.model_validate({"taken_at": NOW - 1, "native": True, "threads": threads}), 0.0)


def gpu_rank(case: str, r: int, stuck_in_sync: bool = True, **kw):
    """Rank ``r`` of a recorded scenario, with its pid, spinning at 100% CPU (or as given)."""
    view = rank(r, cpu=100.0, active=True, gpu_utilization_percent=100.0, **kw)
    view = replace(view, pid=PIDS[case][r])
    return replace(view, stack=spinning(case)) if stuck_in_sync else view


def sleeping_rank(case: str, r: int):
    return replace(rank(r, frames=sleeping()), pid=PIDS[case][r])


# (what, the job, verdict, culprits, evidence that must be there)
CASES: list[tuple[str, JobView, str, tuple[int, ...], tuple[str, ...]]] = [
    ("mismatch: every stack the same, NCCL names the rank with the extra broadcast",
     job(*(gpu_rank("mismatch", r) for r in range(3)), progress=STALLED, nccl=ras("mismatch")),
     "deadlock", (0,),
     ("NCCL RAS: rank 0 issued Broadcast #1 that no other rank issued",
      "NCCL RAS: rank 1 reports an NCCL asynchronous error: invalid usage")),
    ("mismatch without NCCL's answer: the stacks alone name no one",
     job(*(gpu_rank("mismatch", r) for r in range(3)), progress=STALLED),
     "deadlock", (), ()),
    ("idle_rank1 as recorded: rank 1 sleeps, NCCL agrees it stopped first",
     job(gpu_rank("idle_rank1", 0), sleeping_rank("idle_rank1", 1), progress=STALLED, nccl=ras("idle_rank1")),
     "deadlock", (1,),
     ("NCCL RAS: rank 1 stopped at AllReduce 60 while rank 0 launched up to 64",)),
    ("idle_rank1 with both stacks in the same sync: NCCL alone names rank 1",
     job(gpu_rank("idle_rank1", 0), gpu_rank("idle_rank1", 1), progress=STALLED, nccl=ras("idle_rank1")),
     "deadlock", (1,),
     ("NCCL RAS: rank 1 stopped at AllReduce 60 while rank 0 launched up to 64",)),
    ("exit_rank1, rank 1's node unwatched: NCCL names its pid and host",
     job(gpu_rank("exit_rank1", 0), world_size=2, progress=STALLED, nccl=ras("exit_rank1")),
     "deadlock", (1,),
     ("NCCL RAS: rank 1 (pid 602 on 127.0.0.1) gives NCCL no data: unresponsive",
      "NCCL RAS: rank 0 reports an NCCL asynchronous error: remote error")),
    ("a rank alive to its agent but gone for NCCL: named",
     job(gpu_rank("exit_rank1", 0), gpu_rank("exit_rank1", 1), progress=STALLED, nccl=ras("exit_rank1")),
     "deadlock", (1,),
     ("NCCL RAS: rank 1 (pid 602 on 127.0.0.1) gives NCCL no data: unresponsive",)),
    ("an answer read before the job stopped says nothing",
     job(*(gpu_rank("mismatch", r) for r in range(3)), progress=STALLED, nccl=ras("mismatch", polled_at=NOW - 15)),
     "deadlock", (), ()),
    ("an answer no later poll confirmed yet: its counts may still move",
     job(*(gpu_rank("mismatch", r) for r in range(3)), progress=STALLED, nccl=ras("mismatch", unchanged_for=0)),
     "deadlock", (), ()),
    ("a running job: counts that differ are collectives in flight",
     job(*(gpu_rank("mismatch", r, stuck_in_sync=False) for r in range(3)), progress=RUNNING, nccl=ras("mismatch")),
     "healthy", (), ()),
]


@pytest.mark.parametrize(("what", "view", "verdict", "culprits", "lines"), CASES, ids=[c[0] for c in CASES])
def test_nccl_evidence_in_the_verdict(what, view, verdict, culprits, lines):
    result = diagnose(view)
    assert result.verdict == verdict, result.summary
    assert result.culprit_ranks == culprits, (result.summary, result.evidence)
    for line in lines:
        assert line in result.evidence, result.evidence
    if lines:
        assert "; NCCL: " in result.summary
        assert any(line.startswith("NCCL RAS answer read 2s ago, unchanged for 22s") for line in result.evidence)
    else:
        assert not any("NCCL" in line for line in result.evidence)


def test_the_hint_says_where_to_look():
    result = diagnose(job(*(gpu_rank("mismatch", r) for r in range(3)), progress=STALLED, nccl=ras("mismatch")))
    assert result.hints[0].startswith("rank 0 issued a Broadcast the others did not: look for a collective "
                                      "under a rank-dependent branch")
    # The stacks' guess for identical stacks (the network, tensor sizes) gives way to NCCL's finding.
    assert not any("suspect the network" in h for h in result.hints), result.hints
    without = diagnose(job(*(gpu_rank("mismatch", r) for r in range(3)), progress=STALLED))
    assert any("suspect the network" in h for h in without.hints), without.hints


# --- the counting rules on their own --------------------------------------------------------------


def comm(*counts: dict[str, int], known: bool = True) -> NcclComm:
    ranks = tuple(NcclRank(comm_rank=i, rank=(10 + i) if known else None, node="n", pid=100 + i,
                           counts=tuple(sorted(c.items()))) for i, c in enumerate(counts))
    return NcclComm("0xabc", len(counts), NOW, NOW, ranks)


A = "AllReduce"
# (what, the communicator, strength, culprits, text)
RULES = [
    ("one rank behind the majority", comm({A: 64}, {A: 64}, {A: 60}), MAJORITY, (12,),
     "rank 12 stopped at AllReduce 60 while ranks 10, 11 launched up to 64"),
    ("one rank ahead of the majority", comm({A: 65}, {A: 64}, {A: 64}), MAJORITY, (10,),
     "rank 10 launched AllReduce up to 65 while ranks 11, 12 stopped at 64"),
    ("a type only one of two ranks issued", comm({"Broadcast": 1, A: 64}, {A: 64}), ISSUED_ALONE, (10,),
     "rank 10 issued Broadcast #1 that no other rank issued"),
    ("a type half the ranks issued, several times", comm({"Barrier": 3}, {"Barrier": 3}, {}, {}), ISSUED_ALONE,
     (10, 11), "ranks 10, 11 issued Barrier #1..#3 that the other ranks never issued"),
    ("two ranks, no majority: the lowest count", comm({A: 64}, {A: 60}), STOPPED_FIRST, (11,),
     "rank 11 stopped at AllReduce 60 while rank 10 launched up to 64"),
    ("four ranks split two and two", comm({A: 5}, {A: 5}, {A: 4}, {A: 4}), STOPPED_FIRST, (12, 13),
     "ranks 12, 13 stopped at AllReduce 4 while ranks 10, 11 launched up to 5"),
    ("ranks the job does not know by pid are named by their place in the communicator",
     comm({A: 64}, {A: 60}, known=False), STOPPED_FIRST, (),
     "communicator rank 1 (pid 101) stopped at AllReduce 60 while communicator rank 0 (pid 100) launched up to 64"),
]


@pytest.mark.parametrize(("what", "c", "strength", "culprits", "text"), RULES, ids=[r[0] for r in RULES])
def test_mismatch_rules(what, c, strength, culprits, text):
    (found,) = mismatches(c)
    assert (found.strength, found.culprits, found.text) == (strength, culprits, text)


def test_equal_counts_and_lone_ranks_find_nothing():
    assert mismatches(comm({A: 64}, {A: 64, "Broadcast": 0})) == []
    assert mismatches(comm({A: 64})) == []


def test_the_strongest_finding_names_the_culprits():
    c = comm({"Broadcast": 1, A: 64}, {A: 68})  # rank 10's extra broadcast, rank 11 ran on
    found = mismatches(c)
    assert [f.strength for f in found] == [STOPPED_FIRST, ISSUED_ALONE]
    assert culprits_of(found) == (10,)


def test_a_missing_rank_of_a_subgroup_is_named_but_not_blamed_by_number():
    sub = NcclComm("0xsub", 2, NOW, NOW, missing=(NcclMissingRank(1, None, 77, "10.0.0.9", considered_dead=True),))
    (found,) = missing(sub, world_size=8)
    assert found.culprits == ()
    assert found.text == "rank 1 of communicator 0xsub (pid 77 on 10.0.0.9) gives NCCL no data: considered dead"
    (found,) = missing(replace(sub, size=8), world_size=8)  # the world's communicator: its ranks are the job's
    assert found.culprits == (1,)
