"""The monitor's signal orders as the agent carries them out (agent/signal_orders.py), on real processes."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agent.signal_orders import RankTarget, SignalOrders, _read_starttime


@pytest.fixture
def rank_process() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


JOB = "10.0.0.1:29500"  # the job the agent's discovery places the process in (its MASTER_ADDR:MASTER_PORT)
MISSING = object()  # a field the order leaves out


def _orders(proc: subprocess.Popen, allowed: bool = True, rank: int = 1, starttime: int | None = None) -> SignalOrders:
    target = RankTarget(proc.pid, JOB, rank,
                        starttime if starttime is not None else _read_starttime("/proc", proc.pid), 100.0)
    return SignalOrders(allowed, lambda pid: target if pid == proc.pid else None)


def _order(proc: subprocess.Popen, **fields) -> dict:
    order = {"id": "o-1", "signal": "SIGTERM", "job_id": JOB, "rank": 1, "pid": proc.pid, "started_at": 100.0}
    return {k: v for k, v in {**order, **fields}.items() if v is not MISSING}


def test_an_order_for_a_tracked_rank_of_the_named_job_signals_it_and_the_result_is_reported_once(rank_process) -> None:
    orders = _orders(rank_process)
    orders.take([_order(rank_process)])
    assert rank_process.wait(timeout=10) == -signal.SIGTERM
    assert orders.results() == [{"id": "o-1", "ok": True, "detail": f"sent SIGTERM to rank 1 (pid {rank_process.pid})"}]
    assert orders.results() == []


@pytest.mark.parametrize(("allowed", "fields", "starttime", "needle"), [
    (False, {}, None, "started without --allow-signals"),
    (True, {"signal": "SIGKILL"}, None, "signal 'SIGKILL' is not one an agent sends"),
    (True, {"rank": 0}, None, "is not a live rank 0 this agent tracks"),
    (True, {"pid": 1}, None, "pid 1 is not a live rank 1 this agent tracks"),
    (True, {"started_at": 5000.0}, None, "another process than the rank the monitor named"),
    (True, {}, 1, "was reused by another process"),
    (True, {"pid": "1"}, None, "names no pid and rank"),
    # Another job's rank with the same rank number: the pid and rank fit, the job does not.
    (True, {"job_id": "10.0.0.2:29500"}, None,
     f"is rank 1 of job '{JOB}' here, not of job '10.0.0.2:29500' the order names"),
    # One spelling of the job is not another's: the order carries the id this agent reported.
    (True, {"job_id": "node-a:29500"}, None, f"of job '{JOB}' here, not of job 'node-a:29500'"),
    # From a monitor that does not name the job: refused, whatever else fits.
    (True, {"job_id": MISSING}, None, "the order names no job (a monitor too old for this agent?)"),
    (True, {"job_id": None}, None, "the order names no job"),
    (True, {"job_id": ""}, None, "the order names no job"),
    (True, {"job_id": ["10.0.0.1:29500"]}, None, "the order names no job"),
])
def test_an_order_that_does_not_name_a_live_tracked_rank_of_its_job_is_refused(
        rank_process, allowed: bool, fields: dict, starttime: int | None, needle: str,
        caplog: pytest.LogCaptureFixture) -> None:
    orders = _orders(rank_process, allowed=allowed, starttime=starttime)
    with caplog.at_level(logging.ERROR, logger="agent.signal_orders"):
        orders.take([_order(rank_process, **fields)])
    [result] = orders.results()
    assert not result["ok"] and needle in result["detail"], result
    assert rank_process.poll() is None  # untouched
    # Said in the agent's log too, not only in the monitor's audit (which may never get the result).
    assert [r.getMessage() for r in caplog.records] == [f"monitor's order o-1: {result['detail']}"]


def test_a_rank_gone_before_the_order_is_a_failed_result(rank_process) -> None:
    orders = _orders(rank_process)
    rank_process.kill()
    rank_process.wait()
    orders.take([_order(rank_process)])
    [result] = orders.results()
    assert not result["ok"] and "is gone" in result["detail"], result


def test_malformed_orders_are_ignored() -> None:
    orders = SignalOrders(True, lambda pid: None)
    orders.take("not a list")
    orders.take([1, {"no": "id"}])
    assert orders.results() == []
