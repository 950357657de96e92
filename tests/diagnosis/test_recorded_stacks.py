"""Real py-spy dumps of stuck gloo ranks (tests/fixtures/stacks), read the way the monitor reads them.

The path is the production one: the agent's py-spy JSON parser, the wire model, the
monitor's conversion to a ``Stack``, then the diagnosis's wait classification.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from agent.stacks import parse_dump
from monitor.diagnosis import diagnose
from monitor.diagnosis.stacks import wait_point
from monitor.ingest.rank_ingest import to_stack
from monitor.ingest.wire import StackReport
from tests.diagnosis.builders import NOW, job, rank, steps

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def recorded(case: str, rank: int, native: bool) -> tuple[object, float]:
    name = f"{case}_rank{rank}{'_native' if native else ''}.json"
    meta = json.loads((FIXTURES / f"{case}.meta.json").read_text())
    info = meta["ranks"][str(rank)]
    threads = parse_dump((FIXTURES / name).read_text(), info["pid"])
    report = StackReport.model_validate({"taken_at": 0.0, "native": native, "threads": threads})
    return to_stack(report, 0.0), info["cpu_percent_1s"]


# (case, rank, native, expected wait kind or None, expected call site or None)
ROWS = [
    ("allreduce_linger", 0, False, "all_reduce", "train.py"),
    ("allreduce_linger", 0, True, "all_reduce", "train.py"),
    ("allreduce_linger", 1, False, None, None),
    ("allreduce_linger", 1, True, None, None),
    ("extra_barrier", 0, False, "barrier", "train.py"),
    ("extra_barrier", 1, False, "all_reduce", "train.py"),
    ("extra_broadcast", 0, False, "broadcast", "train.py"),
    ("ddp_linger", 0, False, "ddp_backward", "train.py"),
    ("ddp_linger", 0, True, "ddp_backward", "train.py"),
    ("async_linger", 0, True, "work_wait", "train.py"),
    ("straggle", 0, False, "all_reduce", "train.py"),
    ("straggle", 1, False, None, None),
    ("busy_all", 0, True, None, None),
    ("rendezvous", 0, False, "rendezvous", None),
    ("rendezvous", 1, False, "rendezvous", None),
]


@pytest.mark.parametrize(("case", "rank", "native", "kind", "site_file"), ROWS,
                         ids=[f"{r[0]}-rank{r[1]}{'-native' if r[2] else ''}" for r in ROWS])
def test_recorded_dump_is_classified(case, rank, native, kind, site_file) -> None:
    stack, cpu = recorded(case, rank, native)
    point = wait_point(stack, cpu)
    assert (point.kind if point else None) == kind
    if site_file:
        assert point is not None and point.call_site.startswith(site_file)


def test_async_wait_is_invisible_without_native_frames() -> None:
    # Why stuck ranks get native dumps: the Python stack alone shows only the caller.
    stack, cpu = recorded("async_linger", 0, False)
    assert wait_point(stack, cpu) is None


def nccl_stack(rank: int, taken_at: float):
    text = (FIXTURES / "nccl" / f"mismatch_rank{rank}_native.json").read_text()
    threads = parse_dump(text, 5100 + rank)
    return to_stack(StackReport.model_validate({"taken_at": taken_at, "native": True, "threads": threads}), 0.0)


def test_nccl_ranks_spinning_at_full_cpu_are_waiting_not_computing() -> None:
    views = [
        replace(rank(r, cpu=100.0, gpu_utilization_percent=100.0), stack=nccl_stack(r, NOW - 1)) for r in (0, 1)
    ]
    result = diagnose(job(*views, progress=steps(NOW - 12, 0.1)))
    assert result.verdict == "deadlock", result.summary
    # The rank-1-only barrier is the odd one out; the step's own wait is the regular one.
    assert result.culprit_ranks == (1,), result.summary
    assert {g.site for g in result.groups} == {"cuda_sync@train.py:77", "barrier@train.py:95"}
