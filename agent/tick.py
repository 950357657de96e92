"""What the collectors share: each tracked rank's record, the node's findings, and one tick's context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from agent.discovery import RankProcess
from agent.procstat import ProcessSample
from agent.stacks import looks_stuck, parked


@dataclass
class Tracked:
    """A rank found on this node and what the collectors last read of it."""

    proc: RankProcess
    discovered_at: float
    started_at: float | None
    alive: bool = True
    ended_at: float | None = None
    sample: ProcessSample | None = None
    sched: dict | None = None  # the SchedReport dict (agent/sched.py); None before a second sample
    wchar: int | None = None
    write_rate: float | None = None
    low_cpu_since: float | None = None
    # Seen at work (CPU over LOW_CPU_PERCENT) at least once: idle CPU after that is a change.
    worked: bool = False
    # The file-system call the main thread is blocked in, read while the rank looks stuck.
    blocked_io: dict | None = None
    sockets: list[dict] = field(default_factory=list)
    sockets_at: float | None = None
    error_file: dict | None = None
    error_file_tries: int = 0
    gpus: list[dict] = field(default_factory=list)


@dataclass
class NodeFindings:
    """The node's own signals, kept across ticks (some collectors run only every few seconds)."""

    host: dict = field(default_factory=dict)
    orphans: list[dict] = field(default_factory=list)


class StackPlan(NamedTuple):
    stuck: frozenset[int]  # stuck by their log or CPU (looks_stuck)
    dump: frozenset[int]  # whose stacks the monitor's own clock needs
    python_only: frozenset[int]  # of those, the ranks at work beside a parked one: Python dumps only


@dataclass
class Tick:
    """One tick's context: its time, the ranks, and what earlier collectors found for later ones."""

    now: float
    tracked: dict[int, Tracked]
    progress_of: Callable[[int], dict | None]
    # --once: collect everything now, as a person asking for one report expects.
    one_shot: bool = False
    schedule_stacks: bool = True
    backing_off: str | None = None  # why no stack dumps are scheduled (the agent over its CPU cap)
    sockets_due: bool = False  # set by the sockets collector; the launchers' sweep follows it

    @property
    def alive(self) -> list[Tracked]:
        # Asked afresh: the exits collector ends ranks part-way through a tick.
        return [t for t in self.tracked.values() if t.alive]

    @cached_property
    def plan(self) -> StackPlan:
        """Which ranks look stuck, judged once a tick on first use: the registry puts every user after
        the logs collector, so on this tick's log lines.

        Stacks are wanted of the ranks stuck by their log, parked by their CPU, and the ranks of a job
        one of whose ranks here is parked (Python dumps only, for those at work): a rank that evaluates
        or saves while its peers wait at a barrier must show its phase even when its log says nothing
        for minutes (a job that logs every 100th step).
        """
        alive = self.alive
        stuck = {t.proc.pid for t in alive if looks_stuck(self.now, self.progress_of(t.proc.pid), t.low_cpu_since)}
        parked_here = {t.proc.pid for t in alive if parked(self.now, t.low_cpu_since, t.worked)}
        parked_jobs = {t.proc.identity.job_id for t in alive if t.proc.pid in parked_here}
        beside_parked = {t.proc.pid for t in alive if t.proc.identity.job_id in parked_jobs} - parked_here - stuck
        return StackPlan(frozenset(stuck), frozenset(stuck | parked_here | beside_parked), frozenset(beside_parked))
