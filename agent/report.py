"""Build the report dict the monitor validates (monitor/ingest/wire.py, schema version 1).

Plain dicts on purpose: the agent stays standalone; a contract test checks the
output against the monitor's pydantic models.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.procstat import ProcessSample

SCHEMA_VERSION = 1
NODE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def default_node_name() -> str:
    name = re.sub(r"[^A-Za-z0-9_.:\-]", "-", socket.gethostname())[:128]
    return name or "node"


@dataclass(frozen=True)
class RankSignals:
    """What the agent read of one rank, for rank_report to put on the wire."""

    alive: bool
    exit: dict | None
    started_at: float | None
    sample: ProcessSample | None = None
    wchar: int | None = None
    write_rate: float | None = None
    progress: dict | None = None
    log_phase: dict | None = None
    log_errors: Sequence[str] = ()
    stack: dict | None = None
    stack_error: str | None = None
    sockets: Sequence[dict] = ()
    error_file: dict | None = None
    dtype: tuple[str, str] | None = None  # (dtype, the log line that says it)
    gpus: Sequence[dict] = ()
    # The rank's latest Flight Recorder dump (agent/flight_recorder.py); None: none read.
    flight_recorder: dict | None = None
    # The file-system call the main thread is blocked in, while the rank looks stuck (agent/blocked_io.py).
    blocked_io: dict | None = None
    # CPU the rank was denied over the last interval (agent/sched.py); None: not read yet.
    sched: dict | None = None


def rank_report(proc, signals: RankSignals) -> dict:
    s = signals
    ident = proc.identity
    out = {
        "job_id": ident.job_id,
        "rank": ident.rank,
        "world_size": ident.world_size,
        "local_rank": ident.local_rank,
        "pid": proc.pid,
        "cmdline": proc.cmdline,
        "launcher": ident.launcher,
        "identified_by": ident.identified_by,
        "started_at": s.started_at,
        "alive": s.alive,
        "exit": dict(s.exit) if s.exit else None,
        "state": None,
        "cpu_percent": None,
        "cpu_seconds": None,
        "rss_bytes": None,
        "threads": None,
        "wchar": s.wchar,
        "write_bytes_per_s": s.write_rate if s.alive else None,
        "progress": s.progress,
        "log_phase": s.log_phase,
        "log_errors": list(s.log_errors)[-50:],
        "stack": s.stack,
        "stack_error": s.stack_error,
        "env": dict(getattr(proc, "env", {}) or {}),
        "sockets": list(s.sockets)[:256],
        "error_file": s.error_file,
        "compute_dtype": s.dtype[0] if s.dtype else None,
        "compute_dtype_line": s.dtype[1] if s.dtype else None,
        "gpus": list(s.gpus)[:16],
        "flight_recorder": s.flight_recorder,
        "blocked_io": s.blocked_io,
        "sched": s.sched if s.alive else None,
    }
    if s.sample is not None:
        out.update(
            state=s.sample.state,
            cpu_percent=s.sample.cpu_percent if s.alive else None,
            cpu_seconds=s.sample.cpu_seconds,
            rss_bytes=s.sample.rss_bytes,
            threads=s.sample.threads,
        )
    if not s.alive:
        out["state"] = "X"
    return out


def orphan_report(proc, started_at: float | None, listening_ports: list[int]) -> dict:
    return {
        "pid": proc.pid,
        "cmdline": proc.cmdline,
        "started_at": started_at,
        "listening_ports": listening_ports[:64],
    }


def build_report(
    *,
    node: str,
    now: float,
    agent: dict,
    host: dict,
    collectors: list[dict],
    ranks: list[dict],
    launchers: list[dict] = (),
    orphans: list[dict] = (),
    nccl_ras: dict | None = None,
    order_results: list[dict] = (),
) -> dict:
    report = {
        "schema_version": SCHEMA_VERSION,
        "node": node,
        "sent_at": now,
        "agent": agent,
        "host": host,
        "collectors": collectors,
        "ranks": ranks,
        "launchers": list(launchers)[:256],
        "orphans": list(orphans)[:64],
        # NCCL's RAS service's view of this node's ranks (agent/nccl_ras.py); null when not polled.
        "nccl_ras": nccl_ras,
    }
    if order_results:  # the outcome of the monitor's signal orders (agent/signal_orders.py)
        report["order_results"] = list(order_results)
    return report
