"""Ranks whose environment does not name their rank, found from the process tree.

- Lightning's own launcher: the children carry LOCAL_RANK, NODE_RANK, WORLD_SIZE and the
  master, and run the parent's command again; the parent (the user's process) is local
  rank 0.
- ``torch.multiprocessing.spawn``: ``spawn_main`` children of one Python parent, ranked by
  start order, once there is evidence that they are a distributed job (libtorch loaded, and
  a process group's environment or sockets): a DataLoader's or a Pool's spawned workers
  look the same otherwise.

The rules are pure (agent/identity.py); this module reads what they need from /proc: the
parent's command line and environment, a child's maps and sockets, each once per process
(evidence of an unconfirmed spawn group at most every SPAWN_EVIDENCE_EVERY_S). A group is
only reported once its youngest member is SETTLE_S old: its size (world size, and NODE_RANK's
offset) is read from how many there are, and the agent keeps the identity it first sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.identity import (
    SPAWN_ENV_EVIDENCE,
    LightningChild,
    RankProcess,
    lightning_ranks,
    _int,
    maps_torch,
    same_program,
    spawn_env_evidence,
    spawn_ranks,
    spawn_socket_evidence,
)
from agent.procinfo import is_python, read_argv, read_environ, read_exe
from agent.procstat import CLOCK_TICKS, Stat, uptime_ticks
from agent.redact import DEFAULT_REDACTOR, Redactor
from agent.sockets import SocketReader

SETTLE_S = 1.0
SPAWN_EVIDENCE_EVERY_S = 2.0
MAX_SPAWN_CHILDREN = 1024
# What of a spawn child's or parent's environment the rules read (identity.spawn_ranks).
SPAWN_FACTS = (*SPAWN_ENV_EVIDENCE, "NODE_RANK")


@dataclass(frozen=True)
class Candidate:
    """A Python process that may be a rank its environment does not name, as discovery saw it."""

    pid: int
    ppid: int
    starttime: int
    cmdline: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(compare=False)  # the reported (allowlisted) part
    lightning: LightningChild | None = None
    # For a spawn_main child: SPAWN_FACTS found in its environment; None for other processes.
    spawn_facts: dict[str, str] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class _Parent:
    pid: int
    ppid: int
    starttime: int
    argv: tuple[str, ...]
    cmdline: str
    env: dict[str, str]  # reported part
    facts: dict[str, str]  # SPAWN_FACTS


@dataclass
class _SpawnGroup:
    children: set[tuple[int, int]] = field(default_factory=set)  # (starttime, pid), ended ones too
    confirmed: bool = False
    checked_at: float | None = None


def spawn_facts(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k][:256] for k in SPAWN_FACTS if k in env}


class DerivedRanks:
    """``find()`` once per discovery scan; caches per process, forgets the ones gone."""

    def __init__(self, proc_root: str = "/proc",
                 report_env: Callable[[dict[str, str], int], dict[str, str]] = lambda env, _pid: dict(env),
                 clock: Callable[[], float] = time.monotonic, redactor: Redactor = DEFAULT_REDACTOR) -> None:
        self.proc_root = proc_root
        self.report_env = report_env  # discovery's allowlist, for a parent that turns out a rank
        self.clock = clock
        self.redactor = redactor  # for a parent's reported command line
        self.sockets = SocketReader(proc_root)
        self._parents: dict[tuple[int, int, str], _Parent | None] = {}
        self._torch: set[tuple[int, int]] = set()  # children seen with libtorch loaded
        self._spawn: dict[tuple[int, int], _SpawnGroup] = {}

    def find(self, stats: Mapping[int, Stat], candidates: Sequence[Candidate], excluded: set[int]) -> list[RankProcess]:
        """The ranks among ``candidates`` and their parents. ``excluded``: processes that are
        never a launching parent (ranks, launchers, processes with a rank's environment: the
        spawned or forked helpers of those are their workers, not ranks)."""
        self._forget_gone(stats)
        kids_of: dict[int, list[Candidate]] = {}
        for c in candidates:
            kids_of.setdefault(c.ppid, []).append(c)
        not_parents = excluded | {c.pid for c in candidates}
        now_ticks = uptime_ticks(self.proc_root) if candidates else None  # None: report at once
        self.sockets.new_sweep()
        out: dict[int, RankProcess] = {}
        for ppid, kids in kids_of.items():
            if ppid <= 1 or ppid in not_parents or ppid not in stats:
                continue
            parent = self._parent(stats[ppid])
            if parent is None:
                continue
            lightning = [c for c in kids if c.lightning and same_program(parent.argv, c.argv)]
            spawned = [c for c in kids if c.spawn_facts is not None]
            if lightning:
                if _settled(lightning, now_ticks):
                    out.update(self._lightning(parent, lightning))
            elif spawned:
                out.update(self._spawned(parent, spawned, now_ticks))
        return sorted(out.values(), key=lambda p: p.pid)

    def _lightning(self, parent: _Parent, kids: list[Candidate]) -> dict[int, RankProcess]:
        idents = lightning_ranks(parent.pid, {c.pid: c.lightning for c in kids if c.lightning})
        out = {}
        if parent.pid in idents:
            # Lightning sets the master in rank 0's os.environ too, where /proc does not show it.
            env = {**parent.env, **{k: v for k, v in kids[0].env.items() if k in ("MASTER_ADDR", "MASTER_PORT")}}
            out[parent.pid] = RankProcess(parent.pid, parent.ppid, parent.starttime, idents[parent.pid],
                                          parent.cmdline, env)
        for c in kids:
            if c.pid in idents:
                out[c.pid] = RankProcess(c.pid, c.ppid, c.starttime, idents[c.pid], c.cmdline, c.env)
        return out

    def _spawned(self, parent: _Parent, kids: list[Candidate], now_ticks: int | None) -> dict[int, RankProcess]:
        group = self._spawn.setdefault((parent.pid, parent.starttime), _SpawnGroup())
        if len(group.children) < MAX_SPAWN_CHILDREN:
            group.children.update((c.starttime, c.pid) for c in kids)
        if not _settled(kids, now_ticks):
            return {}
        if not group.confirmed:
            now = self.clock()
            if group.checked_at is not None and now - group.checked_at < SPAWN_EVIDENCE_EVERY_S:
                return {}
            group.checked_at = now
            group.confirmed = self._spawn_evidence(parent, kids)
            if not group.confirmed:
                return {}
        facts = {**parent.facts}
        for c in kids:
            facts.update(c.spawn_facts or {})
        idents = spawn_ranks(parent.pid, group.children, facts)
        return {c.pid: RankProcess(c.pid, c.ppid, c.starttime, idents[c.pid], c.cmdline, c.env)
                for c in kids if c.pid in idents}

    def _spawn_evidence(self, parent: _Parent, kids: list[Candidate]) -> bool:
        if not any(self._has_torch(c) for c in kids):
            return False
        facts = [parent.facts, *(c.spawn_facts or {} for c in kids)]
        if spawn_env_evidence(facts):
            return True
        master_port = next((p for p in (_int(f.get("MASTER_PORT")) for f in facts) if p is not None), None)
        sockets = {}
        for c in kids:
            try:
                sockets[c.pid] = self.sockets.sockets_of(c.pid)
            except OSError:
                continue  # gone, or not ours to read
        return spawn_socket_evidence(sockets, master_port)

    def _has_torch(self, c: Candidate) -> bool:
        key = (c.pid, c.starttime)
        if key in self._torch:
            return True
        try:
            with open(f"{self.proc_root}/{c.pid}/maps") as f:
                loaded = maps_torch(f.read())
        except OSError:
            return False
        if loaded:  # only the positive is kept: torch is imported a second or two after start
            self._torch.add(key)
        return loaded

    def _parent(self, stat: Stat) -> _Parent | None:
        key = (stat.pid, stat.starttime, stat.comm)
        if key not in self._parents:
            self._parents[key] = self._read_parent(stat)
        return self._parents[key]

    def _read_parent(self, stat: Stat) -> _Parent | None:
        try:
            argv = read_argv(self.proc_root, stat.pid)
            env = read_environ(self.proc_root, stat.pid)
        except OSError:
            return None  # gone, or not ours to read
        if not argv or not is_python(read_exe(self.proc_root, stat.pid), argv):
            return None
        return _Parent(stat.pid, stat.ppid, stat.starttime, tuple(argv), self.redactor.cmdline(argv),
                       self.report_env(env, stat.pid), spawn_facts(env))

    def _forget_gone(self, stats: Mapping[int, Stat]) -> None:
        if not (self._parents or self._torch or self._spawn):
            return  # the usual case: no launch of this kind on the node
        live = {(pid, s.starttime) for pid, s in stats.items()}
        for key in [k for k in self._parents if (k[0], k[1]) not in live]:
            del self._parents[key]
        self._torch &= live
        for key in [k for k in self._spawn if k not in live]:
            del self._spawn[key]


def _settled(members: Iterable[Candidate], now_ticks: int | None) -> bool:
    """The youngest member is SETTLE_S old: its launcher has started every sibling by now."""
    youngest = max((c.starttime for c in members), default=0)
    return now_ticks is None or now_ticks - youngest >= SETTLE_S * CLOCK_TICKS
