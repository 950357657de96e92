"""Simulated agents for the monitor's load benchmark: one node's reports, built from the wire schema.

Each simulated node holds 8 ranks of one job and reports once a second, the way the real
agent does: CPU and thread states, bytes written, step progress with its recent cadence,
plain py-spy stacks now and then, sockets, the node's host facts. Two protocols:

- ``full``: what agents before the delta protocol send: every report repeats the latest
  stack of every rank, the 32 most recent progress points, sockets, env and host facts.
- ``delta``: what the current agent sends: a full report first (and whenever the monitor
  asks), then stacks only when new, only new progress points, host/env/sockets only when
  changed (see monitor/ingest/wire.py).

A node can be told to deadlock: its ranks stop stepping, go idle and their stacks show the
collective wait, except the culprit rank, which sits in user code. A job can be told to
straggle: from ``straggling_from`` its ``straggler_rank`` does STRAGGLER_FACTOR times the work
per step, so every node of the job steps that much slower and its other ranks spend the
difference waiting in all_reduce (lower CPU, a share of their stacks in the collective).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from monitor.ingest.wire import Report

TORCH = "/opt/venv/lib/python3.11/site-packages/torch"
ALL_REDUCE = [
    {"name": "all_reduce", "file": f"{TORCH}/distributed/distributed_c10d.py", "line": 2501},
    {"name": "wrapper", "file": f"{TORCH}/distributed/c10d_logger.py", "line": 83},
    {"name": "train_step", "file": "/work/train.py", "line": 97},
    {"name": "main", "file": "/work/train.py", "line": 141},
    {"name": "<module>", "file": "/work/train.py", "line": 160},
]
COMPUTE = [
    {"name": "_conv_forward", "file": f"{TORCH}/nn/modules/conv.py", "line": 456},
    {"name": "forward", "file": f"{TORCH}/nn/modules/conv.py", "line": 460},
    {"name": "_call_impl", "file": f"{TORCH}/nn/modules/module.py", "line": 1747},
    {"name": "forward", "file": "/work/model.py", "line": 40},
    {"name": "train_step", "file": "/work/train.py", "line": 90},
    {"name": "main", "file": "/work/train.py", "line": 141},
    {"name": "<module>", "file": "/work/train.py", "line": 160},
]
LINGER = [
    {"name": "main", "file": "/work/train.py", "line": 131},
    {"name": "<module>", "file": "/work/train.py", "line": 160},
]
GLOO_THREAD = {"tid": 2, "name": "gloo", "active": False, "frames": [{"name": "epoll_wait", "native": True}]}
RANKS_PER_NODE = 8
STEP_S = 0.5
# The agent's background plain dump of a healthy rank, and of a rank that looks stuck.
BACKGROUND_DUMP_EVERY_S = 10.0
STUCK_DUMP_EVERY_S = 3.0
STUCK_AFTER_S = 3.0
RECENT_KEPT = 32
STRAGGLER_FACTOR = 1.3


@dataclass
class SimulatedNode:
    index: int
    job_id: str
    first_rank: int
    world_size: int
    deadlocked_at: float | None = None
    culprit_rank: int | None = None
    straggler_rank: int | None = None
    straggling_from: float | None = None
    _steps: list[tuple[float, int]] = field(default_factory=list)
    _stacks: dict[int, dict] = field(default_factory=dict)
    _next_dump: dict[int, float] = field(default_factory=dict)
    _stuck_dumped: set[int] = field(default_factory=set)  # ranks dumped since their stuck episode began
    _cpu_seconds: float = 0.0
    # The node's report before: a rank's CPU is over the interval since (agent/procstat.py).
    _reported_at: float | None = None

    @property
    def name(self) -> str:
        return f"node-{self.index:05d}"

    def report(self, now: float) -> dict:
        """The full report the agent's runner builds (the sender may turn it into a delta)."""
        self._advance(now)
        body = {"schema_version": 1, "node": self.name, "sent_at": now,
                "agent": {"version": "0.1.0", "pid": 100 + self.index, "interval_s": 1.0, "py_spy": "ok"},
                "host": self._host(),
                "collectors": [{"name": n, "ok": True, "duration_s": 0.002} for n in ("procs", "logs", "stacks")],
                "ranks": [self._rank(i, now) for i in range(RANKS_PER_NODE)]}
        self._reported_at = now
        return body

    def _stuck(self, now: float) -> bool:
        return self.deadlocked_at is not None and now >= self.deadlocked_at

    def _advance(self, now: float) -> None:
        last_at, last_step = self._steps[-1] if self._steps else (now - STEP_S, 0)
        limit = min(now, self.deadlocked_at) if self.deadlocked_at is not None else now
        while last_at + self._step_s(last_at) <= limit:
            last_at, last_step = last_at + self._step_s(last_at), last_step + 1
            self._steps.append((last_at, last_step))
        del self._steps[:-RECENT_KEPT]
        self._cpu_seconds += 0.0 if self._stuck(now) else 0.95

    def _straggling(self, now: float) -> bool:
        return self.straggling_from is not None and now >= self.straggling_from

    def _step_s(self, at: float) -> float:
        return STEP_S * (STRAGGLER_FACTOR if self._straggling(at) else 1.0)

    def _cpu(self, rank: int, now: float) -> float:
        busy = random.uniform(90, 99)
        if self._straggling(now) and rank != self.straggler_rank:
            busy /= STRAGGLER_FACTOR  # the rest of each step waits for the straggler
        if not self._stuck(now):
            return busy
        # Averaged over the interval since the node's report before, as the agent measures it: the
        # first reading after the fault is partly of the time before it.
        began = self._reported_at
        if began is None or self.deadlocked_at is None or began >= self.deadlocked_at:
            return 0.4
        worked = (self.deadlocked_at - began) / (now - began)
        return busy * worked + 0.4 * (1 - worked)

    def _rank(self, local: int, now: float) -> dict:
        rank = self.first_rank + local
        stuck = self._stuck(now)
        self._maybe_dump(rank, now, stuck, stuck and rank == self.culprit_rank)
        last_at, step = self._steps[-1] if self._steps else (None, None)
        cpu = self._cpu(rank, now)
        return {
            "job_id": self.job_id, "rank": rank, "world_size": self.world_size, "local_rank": local,
            "pid": 10_000 + rank, "launcher": "torchrun", "started_at": now - 3600, "alive": True,
            "cmdline": f"/opt/venv/bin/python -u /work/train.py --config /work/configs/big.yaml --seed {rank}",
            "state": "S" if stuck else "R", "cpu_percent": cpu,
            "cpu_seconds": self._cpu_seconds, "rss_bytes": 2_000_000_000,
            "threads": {"total": 24, "by_state": {"S": 23, "R": 0 if stuck else 1},
                        "busiest": [{"tid": 10_000 + rank, "name": "python", "state": "S" if stuck else "R",
                                     "cpu_percent": cpu}]},
            "wchar": 1_000_000 + int(now), "write_bytes_per_s": 0.0 if stuck else 120.0,
            "progress": {"events": step or 0, "step": step, "total_steps": 100_000, "step_at": last_at,
                         "scope": "rank", "source": f"/work/logs/rank{rank}.log", "pattern": "step (?P<step>\\d+)",
                         "last_line": f"step {step} loss 2.31", "recent": [list(p) for p in self._steps]},
            "stack": self._stacks.get(rank),
            "env": {"MASTER_ADDR": self.job_id.rsplit(":", 1)[0], "MASTER_PORT": "29500",
                    "GLOO_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"},
            "sockets": [{"local": f"10.2.{self.index // 250}.{self.index % 250}:{40_000 + local}",
                         "remote": f"{self.job_id.rsplit(':', 1)[0]}:29500", "state": "ESTABLISHED",
                         "tx_queue": 0, "rx_queue": 0, "tcp": self._tcp(now, 0)}] + [
                        {"local": f"10.2.{self.index // 250}.{self.index % 250}:{41_000 + local * 8 + j}",
                         "remote": f"10.2.0.{j}:{42_000 + j}", "state": "ESTABLISHED", "tx_queue": 0, "rx_queue": 0,
                         "tcp": self._tcp(now, j + 1)}
                        for j in range(3)],
            # The CPU denied to the rank, every report (agent/sched.py).
            "sched": {"run_queue_wait_percent": round(random.uniform(0, 3), 1), "cpu_throttled_percent": 0.0,
                      "cgroup": f"/kubepods/burstable/pod-{self.index}"},
        }

    @staticmethod
    def _tcp(now: float, j: int) -> dict:
        """tcp_info as the agent sends it: read every SOCKETS_EVERY_S (5 s), so it changes that often."""
        tick = int(now // 5)
        return {"rtt_ms": 0.2 + (tick + j) % 7 / 100, "min_rtt_ms": 0.05, "total_retrans": tick % 3,
                "retrans_per_s": 0.0, "lost": 0, "unacked": 0, "notsent_bytes": 0,
                "delivery_rate_bps": 1.2e9, "bytes_acked_per_s": 3.0e8}

    def _maybe_dump(self, rank: int, now: float, stuck: bool, culprit: bool) -> None:
        due = self._next_dump.get(rank)
        if due is None:
            due = self._next_dump[rank] = now + random.uniform(0, BACKGROUND_DUMP_EVERY_S)
        if not stuck:
            self._stuck_dumped.discard(rank)
        elif self.deadlocked_at is not None and rank not in self._stuck_dumped:
            # Like the agent (agent/stacks.next_dump): a rank idle for STUCK_AFTER_S past its last step
            # is dumped at once at the start of its stuck episode, whenever its background dump was due.
            self._stuck_dumped.add(rank)
            due = self._next_dump[rank] = min(due, self.deadlocked_at + STUCK_AFTER_S)
        if now < due:
            return
        waiting = stuck or (self._straggling(now) and rank != self.straggler_rank
                            and random.random() < 1 - 1 / STRAGGLER_FACTOR)
        frames = LINGER if culprit else ALL_REDUCE if waiting else COMPUTE
        main = {"tid": 10_000 + rank, "name": "MainThread", "active": not waiting, "owns_gil": not waiting,
                "frames": frames}
        self._stacks[rank] = {"taken_at": now, "native": False, "duration_s": 0.03, "threads": [main, GLOO_THREAD]}
        self._next_dump[rank] = now + (STUCK_DUMP_EVERY_S if stuck else BACKGROUND_DUMP_EVERY_S)

    def _host(self) -> dict:
        return {"hostname": self.name, "cpu_count": 96, "cpu_flags": ["avx512f", "amx_bf16"],
                "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
                "interfaces": [{"name": "eth0", "up": True, "addresses": [f"10.1.{self.index // 250}.{self.index % 250}/16"]},
                               {"name": "lo", "up": True, "addresses": ["127.0.0.1/8"]}]}


def cluster(nodes: int, ranks_per_job: int) -> list[SimulatedNode]:
    """``nodes`` nodes of 8 ranks, grouped into jobs of ``ranks_per_job`` ranks (the last may be smaller)."""
    nodes_per_job = max(1, ranks_per_job // RANKS_PER_NODE)
    out = []
    for i in range(nodes):
        job, position = divmod(i, nodes_per_job)
        size = min(nodes_per_job, nodes - job * nodes_per_job) * RANKS_PER_NODE
        out.append(SimulatedNode(i, f"10.1.{job // 250}.{job % 250}:29500", position * RANKS_PER_NODE, size))
    return out


def check_against_schema(node: SimulatedNode, now: float) -> None:
    """Fail fast when the simulation drifts from the wire schema the monitor validates."""
    Report.model_validate(node.report(now))
