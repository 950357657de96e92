"""Agent reports as plain dicts, the way the agent sends them (see monitor/ingest/wire.py)."""

from __future__ import annotations

import time
from typing import Any


def frame(name: str, file: str = "", line: int | None = None, native: bool = False) -> dict[str, Any]:
    return {"name": name, "file": file, "line": line, "native": native}


ALL_REDUCE_FRAMES = [
    frame("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2501),
    frame("wrapper", "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py", 83),
    frame("train_step", "/work/train.py", 50),
    frame("<module>", "/work/train.py", 90),
]


def stack(
    taken_at: float, frames: list[dict[str, Any]] | None = None, active: bool | None = False, **fields: Any
) -> dict[str, Any]:
    main = {"tid": 1, "name": "MainThread", "active": active, "owns_gil": False,
            "frames": ALL_REDUCE_FRAMES if frames is None else frames}
    other = {"tid": 2, "name": "gloo_tcp_loop", "active": False, "frames": [frame("epoll_wait", native=True)]}
    return {"taken_at": taken_at, "native": False, "duration_s": 0.02, "threads": [main, other], **fields}


def progress(
    events: int,
    step: int | None,
    recent: list[tuple[float, int]] | None = None,
    scope: str = "rank",
    **fields: Any,
) -> dict[str, Any]:
    recent = recent or []
    return {
        "events": events,
        "step": step,
        "total_steps": 1000,
        "step_at": recent[-1][0] if recent else None,
        "scope": scope,
        "source": "/work/train.log",
        "pattern": r"step (\d+)",
        "last_line": f"step {step}",
        "recent": [list(pair) for pair in recent],
        **fields,
    }


def rank(job_id: str = "job-a", rank: int = 0, world_size: int = 2, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": job_id,
        "rank": rank,
        "world_size": world_size,
        "local_rank": rank,
        "pid": 1000 + rank,
        "cmdline": "python train.py",
        "launcher": "torchrun",
        "alive": True,
        "state": "S",
        "cpu_percent": 95.0,
        "cpu_seconds": 12.5,
        "rss_bytes": 500_000_000,
        "write_bytes_per_s": 0.0,
        "log_errors": [],
    }
    base.update(fields)
    return base


def report(
    node: str = "node-a", ranks: list[dict[str, Any]] | None = None, sent_at: float | None = None, **fields: Any
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema_version": 1,
        "node": node,
        "sent_at": time.time() if sent_at is None else sent_at,
        "agent": {"version": "0.1.0", "pid": 42, "started_at": 0.0, "interval_s": 1.0, "py_spy": "ok"},
        "host": {"hostname": node, "cpu_count": 8, "cpu_flags": ["avx512_bf16"], "cpu_model": "Test CPU"},
        "collectors": [
            {"name": "proc", "ok": True, "duration_s": 0.001},
            {"name": "stacks", "ok": True, "duration_s": 0.02},
        ],
        "ranks": [rank()] if ranks is None else ranks,
    }
    base.update(fields)
    return base


def socket(local: str, remote: str, state: str = "ESTABLISHED", **fields: Any) -> dict[str, Any]:
    return {"local": local, "remote": remote, "state": state, **fields}


def launcher(job_id: str | None = "job-a", pid: int = 900, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "pid": pid,
        "job_id": job_id,
        "cmdline": "torchrun --nnodes 2 --nproc-per-node 2 train.py",
        "alive": True,
        "state": "S",
        "nnodes": "2",
        "nproc_per_node": "2",
        "node_rank": 0,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "worker_pids": [],
    }
    base.update(fields)
    return base


def orphan(pid: int, cmdline: str = "python train.py", ports: list[int] | None = None) -> dict[str, Any]:
    return {"pid": pid, "cmdline": cmdline, "started_at": 0.0, "listening_ports": ports or []}
