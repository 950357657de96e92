"""Signals the monitor asks this agent to send to a job's culprit ranks (an opt-in action,
monitor/engine/actions/): the only thing the monitor can make an agent do.

Refused unless the agent was started with ``--allow-signals``: a monitor, or whoever holds its
address, must not be able to end training processes on a node whose operator did not agree.
An order names the job, the rank, the pid and its start time, and is carried out only on a
process this agent's own discovery places there: a live rank it tracks, with that pid and rank
number, in that job (the id its environment gives it, agent/identity.py). Anything else is
refused, so an order can never reach a process that is not that rank of that job as seen here:
a node that posts a made-up job naming another job's pid gets a refusal, not a dead rank. A pid
reused since is caught by the start time, read again through a pidfd, which then carries the
signal. Every order gets a result, sent back in the next report (``order_results``) for the
audit log.
"""

from __future__ import annotations

import logging
import os
import signal as signals
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

ALLOWED_SIGNALS = ("SIGTERM", "SIGABRT", "SIGINT", "SIGUSR1", "SIGUSR2")
MAX_RESULTS = 64


@dataclass(frozen=True)
class RankTarget:
    """A rank this agent tracks, as an order must name it."""

    pid: int
    job_id: str  # the job its environment places it in: the id this agent reports it under
    rank: int
    starttime: int  # clock ticks after boot (/proc/PID/stat field 22)
    started_at: float | None


def _read_starttime(proc_root: str, pid: int) -> int | None:
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    try:
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


class SignalOrders:
    def __init__(self, allowed: bool, find_rank: Callable[[int], RankTarget | None], proc_root: str = "/proc") -> None:
        self.allowed = allowed
        self.find_rank = find_rank
        self.proc_root = proc_root
        self._results: list[dict] = []
        self._lock = threading.Lock()

    def take(self, orders: object) -> None:
        """Carry out the orders of one monitor answer (from the sending thread)."""
        if not isinstance(orders, list):
            return
        for order in orders[:MAX_RESULTS]:
            if not isinstance(order, dict) or not isinstance(order.get("id"), str):
                continue
            ok, detail = self._carry_out(order)
            (log.warning if ok else log.error)("monitor's order %s: %s", order["id"][:64], detail)
            with self._lock:
                self._results = (self._results + [{"id": order["id"][:64], "ok": ok, "detail": detail[:500]}])[
                    -MAX_RESULTS:]

    def results(self) -> list[dict]:
        """The results not yet reported, once."""
        with self._lock:
            out, self._results = self._results, []
        return out

    def _carry_out(self, order: dict) -> tuple[bool, str]:
        name, pid, rank, job_id = order.get("signal"), order.get("pid"), order.get("rank"), order.get("job_id")
        if not self.allowed:
            return False, "refused: this agent was started without --allow-signals"
        if name not in ALLOWED_SIGNALS:
            return False, f"refused: signal {name!r} is not one an agent sends ({', '.join(ALLOWED_SIGNALS)})"
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(rank, int) or isinstance(rank, bool):
            return False, "refused: the order names no pid and rank"
        if not isinstance(job_id, str) or not job_id:
            # A monitor from before orders named their job: the pid and rank number alone fit
            # rank 0 of every job on the node.
            return False, "refused: the order names no job (a monitor too old for this agent?)"
        target = self.find_rank(pid)
        if target is None or target.rank != rank:
            return False, f"refused: pid {pid} is not a live rank {rank} this agent tracks"
        if target.job_id != job_id:
            return False, (f"refused: pid {pid} is rank {target.rank} of job {target.job_id[:256]!r} here, "
                           f"not of job {job_id[:256]!r} the order names")
        started_at = order.get("started_at")
        if started_at is not None and target.started_at is not None and abs(started_at - target.started_at) > 1.0:
            return False, f"refused: pid {pid} is another process than the rank the monitor named"
        return self._send(target, getattr(signals, name), name)

    def _send(self, target: RankTarget, number: int, name: str) -> tuple[bool, str]:
        try:
            fd = os.pidfd_open(target.pid)
        except OSError as exc:
            return False, f"pid {target.pid} (rank {target.rank}) is gone: {exc.strerror}"
        try:
            # Checked again through the pidfd: the pid cannot be reused while the fd is open.
            if _read_starttime(self.proc_root, target.pid) != target.starttime:
                return False, f"refused: pid {target.pid} was reused by another process"
            signals.pidfd_send_signal(fd, number)
        except OSError as exc:
            return False, f"could not signal pid {target.pid} (rank {target.rank}): {exc.strerror}"
        finally:
            os.close(fd)
        return True, f"sent {name} to rank {target.rank} (pid {target.pid})"
