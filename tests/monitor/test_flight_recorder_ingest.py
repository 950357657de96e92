"""Flight Recorder dumps through the real app: ingest (full and delta), the clock shift, limits,
the per-rank JSON, and /diagnose naming the rank that stopped issuing collectives.

The dumps are torch 2.13's (tests/fixtures/flight_recorder), read by the agent's own parser,
as the agent sends them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from monitor_reports import ALL_REDUCE_FRAMES, progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient, assert_refused, job_answer, monitor_of, post_report

from agent.flight_recorder_dump import parse_dump
from monitor.ingest import wire
from monitor.ingest.fastwire import _decoder

URL = "/api/v1/reports"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"


def fr(r: int, dumped_at: float, case: str = "stop_rank1") -> dict[str, Any]:
    """The agent's ``flight_recorder`` for rank ``r``'s recorded dump."""
    parsed = parse_dump((FIXTURES / case / f"rank_{r}").read_bytes())
    return {"path": f"/tmp/fr_{r}", "dumped_at": dumped_at, "size": 6000, "status": "ok", **parsed}


def stuck_rank(r: int, now: float, **fields: Any) -> dict[str, Any]:
    """Rank ``r`` waiting in all_reduce (every rank the same stack), steps stopped 12 s ago."""
    points = [(now - 12 - 0.5 * i, 100 - i) for i in reversed(range(16))]
    return rank(job_id="job-fr", rank=r, world_size=3, cpu_percent=0.0, progress=progress(100, 100, points),
                stack=stack(now - 1, ALL_REDUCE_FRAMES), **fields)


post = post_report


def diagnosis_of(client: TestClient, job_id: str = "job-fr") -> dict[str, Any]:
    return job_answer(client, job_id)


def test_diagnose_names_the_rank_behind(client: TestClient, clock: FakeClock) -> None:
    ranks = [stuck_rank(r, clock.now, flight_recorder=fr(r, clock.now - 2)) for r in range(3)]
    post(client, report(ranks=ranks, sent_at=clock.now))
    job = diagnosis_of(client)
    assert job["verdict"] == "deadlock" and job["culprit_ranks"] == [1], job["summary"]
    assert ("Flight Recorder, pg 0: rank 1 last enqueued #40 (all_reduce) while ranks 0, 2 enqueued #41 "
            "(all_reduce)") in job["evidence"]
    shown = job["ranks"][1]["flight_recorder"]
    assert shown["status"] == "ok" and shown["path"] == "/tmp/fr_1"
    assert shown["groups"] == [{"pg": "0", "desc": "default_pg", "last_enqueued": 40, "last_started": -1,
                                "last_completed": 40, "last_enqueued_op": "all_reduce"}]
    assert "Flight Recorder, pg 0: rank 1 last enqueued #40" in client.get("/diagnose").text


def test_times_are_shifted_a_delta_keeps_the_dump_a_new_one_replaces_it(client: TestClient, clock: FakeClock) -> None:
    # The agent's clock runs 5 s ahead of the monitor's.
    post(client, report(ranks=[stuck_rank(0, clock.now, flight_recorder=fr(0, clock.now + 3))], sent_at=clock.now + 5))
    track = monitor_of(client)._state.jobs["job-fr"].ranks[0]
    assert track.flight_recorder.dumped_at == pytest.approx(clock.now - 2)
    entry = track.flight_recorder.groups[0].recent[-1]
    assert entry.created_at == pytest.approx(fr(0, 0)["groups"][0]["recent"][-1]["created_at"] - 5)
    first = track.flight_recorder
    clock.advance(1)
    post(client, report(ranks=[stuck_rank(0, clock.now, flight_recorder=None)], sent_at=clock.now + 5, host=None,
                        delta=True))
    assert monitor_of(client)._state.jobs["job-fr"].ranks[0].flight_recorder is first
    clock.advance(1)
    post(client, report(ranks=[stuck_rank(0, clock.now, flight_recorder=fr(0, clock.now + 4, "mismatch"))],
                        sent_at=clock.now + 5))
    newer = monitor_of(client)._state.jobs["job-fr"].ranks[0].flight_recorder
    assert newer.dumped_at == pytest.approx(clock.now - 1) and newer.groups[0].last_completed == 39


def test_both_decoders_read_a_dump_alike() -> None:
    body = report(ranks=[rank(flight_recorder=fr(0, 10.0))])
    raw = json.dumps(body).encode()
    fast = _decoder.decode(raw)
    slow = wire.Report.model_validate_json(raw)
    assert json.loads(msgspec.json.encode(fast)) == json.loads(slow.model_dump_json())
    assert fast.ranks[0].flight_recorder.groups[1].desc == "evens"


def _group(**fields: Any) -> dict[str, Any]:
    return {"pg": "0", **fields}


@pytest.mark.parametrize(
    ("dump", "field"),
    [
        ({"path": "/x", "dumped_at": 1.0, "groups": [_group()] * 33}, "ranks.0.flight_recorder.groups"),
        ({"path": "/x", "dumped_at": 1.0, "groups": [_group(recent=[{}] * 9)]},
         "ranks.0.flight_recorder.groups.0.recent"),
        ({"path": "/x", "dumped_at": 1.0, "groups": [_group(pg="p" * 65)]}, "ranks.0.flight_recorder.groups.0.pg"),
        ({"path": "/x" * 600, "dumped_at": 1.0}, "ranks.0.flight_recorder.path"),
        ({"path": "/x"}, "ranks.0.flight_recorder.dumped_at"),
    ],
)
def test_limits_hold_and_name_the_field(client: TestClient, dump: dict[str, Any], field: str) -> None:
    assert_refused(client, json.dumps(report(ranks=[rank(flight_recorder=dump)])).encode(), field)
