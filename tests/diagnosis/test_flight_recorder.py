"""Flight Recorder's evidence in the verdict (monitor/diagnosis/flight_recorder.py), table-style.

The rows are built from dumps torch 2.13 wrote on real gloo jobs (tests/fixtures/flight_recorder)
along the production path: the agent's parser, the wire model, the monitor's conversion, then
the diagnosis.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.flight_recorder_dump import parse_dump
from monitor.diagnosis import JobView, diagnose
from monitor.diagnosis.flight_recorder import compare
from monitor.diagnosis.model import FlightRecord, FrEntry, FrGroup
from monitor.ingest.flight_recorder_views import flight_record
from monitor.ingest.wire import FlightRecorderReport
from tests.diagnosis.builders import NOW, collective, job, rank, sleeping, steps

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
STALLED = steps(NOW - 12, 0.5)  # steps that stopped 12 s ago
RUNNING = steps(NOW - 0.1, 0.1)
STUCK = collective("all_reduce", 50)


def dump(case: str, r: int, dumped_at: float = NOW - 3, **fields) -> FlightRecord:
    """Rank ``r``'s recorded dump as the monitor keeps it."""
    parsed = parse_dump((FIXTURES / case / f"rank_{r}").read_bytes())
    report = FlightRecorderReport.model_validate(
        {"path": f"/tmp/fr_{r}", "dumped_at": dumped_at, "status": "ok", **parsed, **fields})
    return flight_record(report, 0.0)


def waiting(r: int, fr: FlightRecord | None, frames=STUCK, **kw):
    return replace(rank(r, frames=frames, **kw), flight_recorder=fr)


def stop_rank1(frames1=STUCK, **dump_kw) -> tuple:
    return tuple(waiting(r, dump("stop_rank1", r, **dump_kw), STUCK if r != 1 else frames1) for r in range(3))


BEHIND = "Flight Recorder, pg 0: rank 1 last enqueued #40 (all_reduce) while ranks 0, 2 enqueued #41 (all_reduce)"
EVENS = "Flight Recorder, pg 1 (evens): ranks 0, 2 all enqueued #1 (all_reduce), completed #1 (all_reduce)"
DISAGREE = "Flight Recorder, pg 0: the ranks disagree on collective #41: rank 0 broadcast; rank 1 all_reduce"

# (what, the job, verdict, culprits, evidence that must be there, whether the summary cites Flight Recorder)
CASES: list[tuple[str, JobView, str, tuple[int, ...], tuple[str, ...], bool]] = [
    ("every stack the same: the dumps name the rank that stopped issuing collectives",
     job(*stop_rank1(), progress=STALLED), "deadlock", (1,), (BEHIND, EVENS), True),
    ("rank 1 sleeps: the stacks name it, the dumps agree",
     job(*stop_rank1(frames1=sleeping()), progress=STALLED), "deadlock", (1,), (BEHIND,), False),
    ("no stacks at all: a stall, the dumps name rank 1",
     job(*(replace(r, stack=None) for r in stop_rank1()), progress=STALLED), "stalled", (1,), (BEHIND,), True),
    ("the same collective number, different collectives: said, nobody named (two ranks)",
     job(waiting(0, dump("mismatch", 0)), waiting(1, dump("mismatch", 1)), progress=STALLED),
     "deadlock", (), (DISAGREE,), False),
    ("dumps written before the job stopped say nothing but that",
     job(*stop_rank1(dumped_at=NOW - 40), progress=STALLED), "deadlock", (),
     ("Flight Recorder: rank 1's dump was written 28s before the job stopped: left out",), False),
    ("one rank's dump alone compares with nothing",
     job(waiting(0, dump("stop_rank1", 0)), waiting(1, None), waiting(2, None), progress=STALLED),
     "deadlock", (), (), False),
    ("an unreadable dump is said",
     job(waiting(0, dump("stop_rank1", 0)), waiting(1, replace(dump("stop_rank1", 1), status="unreadable: truncated",
                                                               groups=())), progress=STALLED),
     "deadlock", (), ("Flight Recorder: rank 1's dump /tmp/fr_1 is unreadable: truncated",), False),
    ("a running job: dumps that differ are collectives in flight",
     job(*(replace(r, stack=None) for r in stop_rank1()), progress=RUNNING), "healthy", (), (), False),
]


@pytest.mark.parametrize(("what", "view", "verdict", "culprits", "lines", "cited"), CASES, ids=[c[0] for c in CASES])
def test_flight_recorder_evidence_in_the_verdict(what, view, verdict, culprits, lines, cited):
    result = diagnose(view)
    assert result.verdict == verdict, result.summary
    assert result.culprit_ranks == culprits, (result.summary, result.evidence)
    for line in lines:
        assert line in result.evidence, result.evidence
    assert ("; Flight Recorder, pg 0: rank 1 last enqueued #40" in result.summary) == cited, result.summary
    if not lines:
        assert not any("Flight Recorder" in line for line in result.evidence), result.evidence


def test_the_dumps_age_and_the_hint():
    result = diagnose(job(*stop_rank1(), progress=STALLED))
    assert "Flight Recorder dumps of ranks 0, 1, 2 written 3s ago" in result.evidence
    assert result.hints[0].startswith("rank 1 stopped issuing collectives in pg 0 after #40 (all_reduce)")
    # The stacks' guess for identical stacks gives way to what the dumps tell.
    assert not any("suspect the network" in h for h in result.hints), result.hints
    older = diagnose(job(waiting(0, dump("stop_rank1", 0, dumped_at=NOW - 5)), waiting(1, dump("stop_rank1", 1)),
                         progress=STALLED))
    assert "Flight Recorder dumps of ranks 0, 1 written 3s to 5s ago" in older.evidence


def test_ranks_that_disagree_are_no_network_problem():
    result = diagnose(job(waiting(0, dump("mismatch", 0)), waiting(1, dump("mismatch", 1)), progress=STALLED))
    assert not any("suspect the network" in h for h in result.hints), result.hints
    assert result.hints[-1].startswith("The ranks ran different collectives as #41 of pg 0")


# --- the comparison rules on their own ------------------------------------------------------------


def group(enqueued: int | None, completed: int | None = None, started: int | None = -1,
          ops: dict[int, str] | None = None) -> FrGroup:
    recent = tuple(FrEntry(seq, op) for seq, op in sorted((ops or {}).items()))
    return FrGroup("0", "default_pg", None, enqueued, started, completed, recent)


AR = {41: "all_reduce", 40: "all_reduce"}
# (what, the group per rank, the ranks named, the strength, the text after "Flight Recorder, pg 0: ")
RULES = [
    ("one rank behind", {0: group(41, ops=AR), 1: group(40, ops=AR), 2: group(41, ops=AR)}, (1,), 3,
     "rank 1 last enqueued #40 (all_reduce) while ranks 0, 2 enqueued #41 (all_reduce)"),
    ("two behind, the others at different numbers", {0: group(42), 1: group(40), 2: group(40), 3: group(41)},
     (1, 2), 3, "ranks 1, 2 last enqueued #40 while ranks 0, 3 enqueued up to #42"),
    ("a rank that never issued one", {0: group(-1), 1: group(5)}, (0,), 3,
     "rank 0 last enqueued none while rank 1 enqueued #5"),
    ("a counter a rank lacks is left out", {0: group(None, 3), 1: group(7, 3), 2: group(7, 2)}, (2,), 1,
     "rank 2 last completed #2 while ranks 0, 1 completed #3"),
    ("the same number, a minority in another collective",
     {0: group(41, ops={41: "broadcast"}), 1: group(41, ops=AR), 2: group(41, ops=AR)}, (0,), 2,
     "the ranks disagree on collective #41: rank 0 broadcast; ranks 1, 2 all_reduce"),
    ("the same number and collective, one completed fewer",
     {0: group(41, 41, ops=AR), 1: group(41, 40, ops=AR)}, (1,), 1,
     "rank 1 last completed #40 (all_reduce) while rank 0 completed #41 (all_reduce)"),
    ("all together: said, nobody named", {0: group(41, 40, ops=AR), 1: group(41, 40, ops=AR)}, (), 0,
     "ranks 0, 1 all enqueued #41 (all_reduce), completed #40 (all_reduce)"),
]


@pytest.mark.parametrize(("what", "groups", "named", "strength", "text"), RULES, ids=[r[0] for r in RULES])
def test_compare(what, groups, named, strength, text):
    found = compare("0", groups)
    assert (found.culprits, found.strength, found.text) == (named, strength, f"Flight Recorder, pg 0: {text}")


def test_a_group_one_rank_dumped_is_not_compared():
    assert compare("0", {0: group(41)}) is None


def test_traces_read_live_from_worker_servers_are_said_so():
    live = [waiting(r, replace(dump("stop_rank1", r), path=f"torch worker server /tmp/w{r}.sock")) for r in (0, 1, 2)]
    result = diagnose(job(*live, progress=STALLED))
    assert "Flight Recorder traces of ranks 0, 1, 2 read live from their torch worker servers 3s ago" in result.evidence
    assert result.culprit_ranks == (1,), result.evidence
