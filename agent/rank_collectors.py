"""The per-rank collectors: finding the ranks, then each signal read of every one into its record."""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.blocked_io import read_blocked_io
from agent.collectors import Registry
from agent.discovery import Discovery
from agent.errorfile import read_error_file
from agent.exits import ExitWatcher, exit_from_stat
from agent.logs import LogFollower
from agent.procio import WriteRateSampler
from agent.procstat import CpuSampler, start_time
from agent.sched import SchedSampler
from agent.sockets import SocketReader
from agent.stacks import LOW_CPU_PERCENT
from agent.tick import Tick, Tracked

log = logging.getLogger(__name__)

VANISHED = (FileNotFoundError, ProcessLookupError)
# Sockets: reading /proc/PID/net/tcp{,6} costs ~1.3 ms each (the kernel walks its whole
# hash table), once per network namespace per sweep. Every tick for ranks that look stuck
# or are young (rendezvous, init_process_group), and launchers without workers; everyone
# else every SOCKETS_EVERY_S, all in the same sweep so they share the table read.
SOCKETS_EVERY_S = 5.0
SOCKETS_YOUNG_S = 30.0
ERROR_FILE_TRIES = 3


def per_rank(ranks: list[Tracked], sample: Callable[[Tracked], None]) -> str | None:
    """``sample`` each rank; the ranks that denied a read are the problem, the rest still collected."""
    denied = []
    for t in ranks:
        try:
            sample(t)
        except VANISHED:
            continue  # exited mid-sample: the exit collector reports it
        except PermissionError as e:
            denied.append(f"pid {t.proc.pid}: {e.strerror}")
    return "; ".join(denied) or None


class Discover:
    def __init__(self, discovery: Discovery, exits: ExitWatcher, booted: float | None,
                 forget: Callable[[int], None]):
        self.discovery, self.exits, self.booted, self.forget = discovery, exits, booted, forget

    def collect(self, tick: Tick) -> None:
        for proc in self.discovery.scan():
            known = tick.tracked.get(proc.pid)
            if known and known.proc.starttime == proc.starttime:
                continue
            if known:  # pid reused by a new rank: the old one is long gone
                self.forget(proc.pid)
            tick.tracked[proc.pid] = Tracked(proc, tick.now, start_time(self.booted, proc.starttime))
            self.exits.watch(proc.pid, proc.starttime)
            log.info(
                "tracking rank %d/%d of job %s (pid %d)",
                proc.identity.rank, proc.identity.world_size, proc.identity.job_id, proc.pid,
            )


class ProcStat:
    def __init__(self, cpu: CpuSampler, exits: ExitWatcher, proc_root: str):
        self.cpu, self.exits, self.proc_root = cpu, exits, proc_root

    def collect(self, tick: Tick) -> str | None:
        return per_rank(tick.alive, lambda t: self._sample(t, tick.now))

    def _sample(self, t: Tracked, now: float) -> None:
        pid = t.proc.pid
        try:
            sample = self.cpu.sample(pid, now)
        except VANISHED:
            if not self.exits.available:  # fallback: no pidfd told us the exact time
                self.exits.record(pid, exit_from_stat(self.proc_root, pid, t.proc.starttime, now))
            raise
        if sample.state in ("Z", "X") and self.exits.exit_of(pid) is None:
            self.exits.record(pid, exit_from_stat(self.proc_root, pid, t.proc.starttime, now))
        t.sample = sample
        if sample.cpu_percent is not None and sample.cpu_percent < LOW_CPU_PERCENT:
            t.low_cpu_since = t.low_cpu_since or now
        elif sample.cpu_percent is not None:
            t.low_cpu_since = None
            t.worked = True


class Sched:
    """CPU the ranks were denied (agent/sched.py): a rate over each interval, so read every tick."""

    def __init__(self, sched: SchedSampler):
        self.sched = sched

    def collect(self, tick: Tick) -> str | None:
        def sample(t: Tracked) -> None:
            t.sched = self.sched.sample(t.proc.pid, tick.now)

        return per_rank(tick.alive, sample)


class Exits:
    def __init__(self, exits: ExitWatcher):
        self.exits = exits

    def collect(self, tick: Tick) -> None:
        for t in tick.alive:
            ex = self.exits.exit_of(t.proc.pid)
            if ex is not None:
                t.alive, t.ended_at = False, tick.now
                log.info(
                    "rank %d of job %s (pid %d) exited: code=%s signal=%s",
                    t.proc.identity.rank, t.proc.identity.job_id, t.proc.pid, ex["code"], ex["signal"],
                )


class ProcIo:
    def __init__(self, io: WriteRateSampler):
        self.io = io

    def collect(self, tick: Tick) -> str | None:
        def sample(t: Tracked) -> None:
            t.wchar, t.write_rate = self.io.sample(t.proc.pid, tick.now)

        return per_rank(tick.alive, sample)


class Logs:
    def __init__(self, logs: LogFollower, exits: ExitWatcher):
        self.logs, self.exits = logs, exits

    def collect(self, tick: Tick) -> None:
        for failure in self.logs.collect([t.proc for t in tick.tracked.values()], tick.now):
            if failure.pid in tick.tracked:
                self.exits.fill_from_launcher(failure.pid, failure.exitcode)


class BlockedIo:
    """The file-system call the main thread is blocked in. A rank at work is in no blocking call worth
    naming: read only while its stack is wanted (a line of /proc, and a path from its memory only while
    it sits in an open)."""

    def __init__(self, proc_root: str):
        self.proc_root = proc_root

    def collect(self, tick: Tick) -> str | None:
        wanted = tick.plan.dump

        def sample(t: Tracked) -> None:
            state = t.sample.state if t.sample else None
            t.blocked_io = read_blocked_io(self.proc_root, t.proc.pid, state=state) if t.proc.pid in wanted else None

        return per_rank(tick.alive, sample)


class Sockets:
    def __init__(self, reader: SocketReader):
        self.reader = reader
        self._at: float | None = None

    def collect(self, tick: Tick) -> str | None:
        self.reader.new_sweep()
        now = tick.now
        tick.sockets_due = self._at is None or now - self._at >= SOCKETS_EVERY_S
        if tick.sockets_due:
            self._at = now
        stuck = tick.plan.stuck

        def sample(t: Tracked) -> None:
            if tick.sockets_due or now - t.discovered_at < SOCKETS_YOUNG_S or t.proc.pid in stuck:
                t.sockets = [e.report() for e in self.reader.sockets_of(t.proc.pid)]
                t.sockets_at = now

        return per_rank(tick.alive, sample)


class ErrorFiles:
    """Once per exit: what torchelastic's @record wrote (retried for a few ticks if not there yet)."""

    def collect(self, tick: Tick) -> None:
        for t in tick.tracked.values():
            path = t.proc.env.get("TORCHELASTIC_ERROR_FILE")
            if t.alive or not path or t.error_file or t.error_file_tries >= ERROR_FILE_TRIES:
                continue
            t.error_file_tries += 1
            t.error_file = read_error_file(path)


def register(registry: Registry) -> None:
    """In the order a tick needs them: found, sampled, ended (a rank that vanished mid-sample), then the
    signals that follow from those (the logs judge who looks stuck for blocked I/O and sockets)."""
    registry.register("discovery", lambda a: Discover(a.discovery, a.exits, a.boot_time, a.forget))
    registry.register("procstat", lambda a: ProcStat(a.cpu, a.exits, a.config.proc_root))
    registry.register("sched", lambda a: Sched(a.sched))
    registry.register("exits", lambda a: Exits(a.exits))
    registry.register("procio", lambda a: ProcIo(a.io))
    registry.register("logs", lambda a: Logs(a.logs, a.exits))
    registry.register("blocked_io", lambda a: BlockedIo(a.config.proc_root))
    registry.register("sockets", lambda a: Sockets(a.sockets))
    registry.register("errorfiles", lambda a: ErrorFiles())
