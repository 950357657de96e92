"""The msgspec decoder mirrors the pydantic wire models: same fields, defaults and limits."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pydantic
import pytest
from monitor_reports import launcher, orphan, progress, rank, report, socket, stack

from monitor.ingest import wire
from monitor.ingest.fastwire import Report, _decoder, decode_report, struct_for


def rich_report() -> dict[str, Any]:
    """Every kind of field the agent sends, most of them set."""
    r = rank(
        rank=3, world_size=8, stack=stack(10.0), progress=progress(5, 50, [(9.0, 49), (10.0, 50)]),
        log_phase={"phase": "evaluation", "seen_at": 9.5, "line": "***** Running Evaluation *****"},
        log_errors=["RuntimeError: boom"], sockets=[socket("10.0.0.2:41000", "10.0.0.1:29500", tx_queue=5)],
        env={"MASTER_PORT": "29500"}, exit=None, threads={"total": 3, "by_state": {"S": 3},
                                                        "busiest": [{"tid": 7, "state": "S", "cpu_percent": 1.0}]},
        error_file={"path": "/tmp/e.json", "message": "boom", "timestamp": 3.0},
        compute_dtype="torch.bfloat16", gpus=[{"index": 0, "utilization_percent": 99.0}],
    )
    return report(ranks=[r], launchers=[launcher(worker_pids=[1003])], orphans=[orphan(77, ports=[29500])],
                  host={"hostname": "h", "interfaces": [{"name": "eth0", "addresses": ["10.0.0.2/24"]}]})


@pytest.mark.parametrize("body", [rich_report(), report(), report(ranks=[]), {"schema_version": 1, "node": "n",
                                                                                "sent_at": 1.0}])
def test_both_decoders_read_the_same_report(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    fast = _decoder.decode(raw)  # the fast path itself, no fallback
    slow = wire.Report.model_validate_json(raw)
    assert json.loads(msgspec.json.encode(fast)) == json.loads(slow.model_dump_json())


def test_every_model_field_is_mirrored() -> None:
    for model in (wire.Report, wire.RankReport, wire.StackReport, wire.ProgressReport, wire.LauncherReport,
                  wire.HostReport, wire.SocketReport, wire.FrameReport):
        assert set(struct_for(model).__struct_fields__) == set(model.model_fields), model.__name__


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["ranks"][0].update(pid=0), "ranks.0.pid"),
        (lambda b: b["ranks"][0].update(world_size=0), "ranks.0.world_size"),
        (lambda b: b["ranks"][0].update(rank=1_000_000), "ranks.0.rank"),
        (lambda b: b.update(node="bad node!"), "node"),
        (lambda b: b.update(node=""), "node"),
        (lambda b: b.update(schema_version=2), "schema_version"),
        (lambda b: b["ranks"][0].update(job_id="j" * 257), "ranks.0.job_id"),
        (lambda b: b["ranks"][0].update(log_phase={"phase": "lunch", "seen_at": 1.0}), "ranks.0.log_phase.phase"),
        (lambda b: b["ranks"][0].update(env={f"K{i}": "v" for i in range(65)}), "ranks.0.env"),
        (lambda b: b["ranks"][0]["stack"]["threads"][0].update(frames=[{"name": "f"}] * 257),
         "ranks.0.stack.threads.0.frames"),
        (lambda b: b["ranks"][0]["progress"].update(recent=[[1.0, 2, 3]]), "ranks.0.progress.recent.0"),
        (lambda b: b.pop("sent_at"), "sent_at"),
    ],
)
def test_limits_hold_on_the_fast_path_and_errors_name_the_field(mutate: Any, field: str) -> None:
    body = rich_report()
    mutate(body)
    raw = json.dumps(body).encode()
    with pytest.raises(msgspec.ValidationError):
        _decoder.decode(raw)
    with pytest.raises(pydantic.ValidationError) as caught:
        decode_report(raw)
    assert field in {".".join(str(p) for p in e["loc"]) for e in caught.value.errors()}


def test_lax_input_pydantic_accepts_still_decodes() -> None:
    body = report(ranks=[dict(rank(), rank="1", pid=1001.0)])  # strings and integral floats, as pydantic allows
    decoded = decode_report(json.dumps(body).encode())
    assert isinstance(decoded, Report)
    assert decoded.ranks[0].rank == 1 and decoded.ranks[0].pid == 1001


def test_delta_fields_may_be_null() -> None:
    body = report(ranks=[rank(sockets=None, stack=None, env={}, cmdline="")], host=None, delta=True)
    decoded = decode_report(json.dumps(body).encode())
    assert decoded.delta is True and decoded.host is None and decoded.ranks[0].sockets is None


def test_defaults_are_fresh_objects() -> None:
    a, b = decode_report(b'{"schema_version":1,"node":"a","sent_at":1}'), decode_report(
        b'{"schema_version":1,"node":"b","sent_at":1}')
    assert a.ranks == [] and a.ranks is not b.ranks
    assert a.agent == b.agent and a.agent is not b.agent
