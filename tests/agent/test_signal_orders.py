"""The monitor's signal orders as the agent carries them out (agent/signal_orders.py), on real processes."""

from __future__ import annotations

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


def _orders(proc: subprocess.Popen, allowed: bool = True, rank: int = 1, starttime: int | None = None) -> SignalOrders:
    target = RankTarget(proc.pid, rank, starttime if starttime is not None else _read_starttime("/proc", proc.pid),
                        100.0)
    return SignalOrders(allowed, lambda pid: target if pid == proc.pid else None)


def _order(proc: subprocess.Popen, **fields) -> dict:
    return {"id": "o-1", "signal": "SIGTERM", "rank": 1, "pid": proc.pid, "started_at": 100.0, **fields}


def test_an_order_for_a_tracked_rank_signals_it_and_the_result_is_reported_once(rank_process) -> None:
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
])
def test_an_order_that_does_not_name_a_live_tracked_rank_is_refused(rank_process, allowed: bool, fields: dict,
                                                                    starttime: int | None, needle: str) -> None:
    orders = _orders(rank_process, allowed=allowed, starttime=starttime)
    orders.take([_order(rank_process, **fields)])
    [result] = orders.results()
    assert not result["ok"] and needle in result["detail"], result
    assert rank_process.poll() is None  # untouched


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
