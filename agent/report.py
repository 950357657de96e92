"""Build the report dict the monitor validates (monitor/ingest/wire.py, schema version 1).

Plain dicts on purpose: the agent stays standalone; a contract test checks the
output against the monitor's pydantic models.
"""

from __future__ import annotations

import re
import socket

SCHEMA_VERSION = 1
NODE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def default_node_name() -> str:
    name = re.sub(r"[^A-Za-z0-9_.:\-]", "-", socket.gethostname())[:128]
    return name or "node"


def rank_report(
    proc,
    *,
    alive: bool,
    exit: dict | None,
    started_at: float | None,
    sample=None,
    wchar: int | None = None,
    write_rate: float | None = None,
    progress: dict | None = None,
    log_phase: dict | None = None,
    log_errors: list[str] = (),
    stack: dict | None = None,
    stack_error: str | None = None,
    sockets: list[dict] = (),
    error_file: dict | None = None,
    dtype: tuple[str, str] | None = None,
    gpus: list[dict] = (),
    flight_recorder: dict | None = None,
    blocked_io: dict | None = None,
) -> dict:
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
        "started_at": started_at,
        "alive": alive,
        "exit": dict(exit) if exit else None,
        "state": None,
        "cpu_percent": None,
        "cpu_seconds": None,
        "rss_bytes": None,
        "threads": None,
        "wchar": wchar,
        "write_bytes_per_s": write_rate if alive else None,
        "progress": progress,
        "log_phase": log_phase,
        "log_errors": list(log_errors)[-50:],
        "stack": stack,
        "stack_error": stack_error,
        "env": dict(getattr(proc, "env", {}) or {}),
        "sockets": list(sockets)[:256],
        "error_file": error_file,
        "compute_dtype": dtype[0] if dtype else None,
        "compute_dtype_line": dtype[1] if dtype else None,
        "gpus": list(gpus)[:16],
        # The rank's latest Flight Recorder dump (agent/flight_recorder.py); null: none read.
        "flight_recorder": flight_recorder,
        # The file-system call the main thread is blocked in, while the rank looks stuck (agent/blocked_io.py).
        "blocked_io": blocked_io,
    }
    if sample is not None:
        out.update(
            state=sample.state,
            cpu_percent=sample.cpu_percent if alive else None,
            cpu_seconds=sample.cpu_seconds,
            rss_bytes=sample.rss_bytes,
            threads=sample.threads,
        )
    if not alive:
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
