"""The agent's sampling loop: run every collector, contained, and build one report per tick."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hangwatch_common.version import version
from agent.discovery import Discovery, OrphanProcess, RankProcess
from agent.exits import ExitWatcher, exit_from_stat
from agent.errorfile import read_error_file
from agent.flight_recorder import FlightRecorderReader
from agent.gpus import GpuCollector
from agent.host import collect_host, collect_interfaces
from agent.launchers import LauncherTracker, launcher_job_id, parse_launcher_args
from agent.logs import LogFollower
from agent.nccl_ras import NcclRasPoller, choose_address, namespace_pid
from agent.nccl_ras_answer import pid_map
from agent.procio import WriteRateSampler
from agent.procstat import CLOCK_TICKS, CpuSampler, ProcessSample
from agent.redact import make_redactor
from agent.report import build_report, orphan_report, rank_report
from hangwatch_common.sdnotify import Notifier
from agent.signal_orders import RankTarget, SignalOrders
from agent.torch_worker_server import WorkerServerFinder
from agent.capture import Capturer
from agent.selfwatch import (
    DEFAULT_MAX_CPU_PERCENT,
    DEFAULT_MAX_RSS_MB,
    EXIT_OVER_MEMORY,
    Limits,
    SelfWatch,
)
from agent.sockets import SocketReader, listening_ports, socket_inodes
from agent.blocked_io import read_blocked_io
from agent.stacks import LOW_CPU_PERCENT, StackError, StackSampler, find_py_spy, looks_stuck, parked
from agent.targets import Dumper

log = logging.getLogger(__name__)

EXITED_KEPT_S = 600.0
# Sockets: reading /proc/PID/net/tcp{,6} costs ~1.3 ms each (the kernel walks its whole
# hash table), once per network namespace per sweep. Every tick for ranks that look stuck
# or are young (rendezvous, init_process_group), and launchers without workers; everyone
# else every SOCKETS_EVERY_S, all in the same sweep so they share the table read.
SOCKETS_EVERY_S = 5.0
SOCKETS_YOUNG_S = 30.0
ERROR_FILE_TRIES = 3
ORPHANS_EVERY_S = 5.0
INTERFACES_EVERY_S = 30.0
# Each poll of NCCL's RAS service runs a collective over every NCCL process of the job, and
# every node's agent polls: only while a rank here looks stuck (when the answer matters).
NCCL_RAS_STUCK_EVERY_S = 3.0
VANISHED = (FileNotFoundError, ProcessLookupError)


@dataclass(frozen=True)
class Config:
    # Every monitor given (sharded by job id, agent/shards.py).
    monitors: tuple[str, ...] = ()
    interval: float = 1.0
    node: str = "node"
    logs: tuple[str, ...] = ()
    step_regex: re.Pattern[str] | None = None
    proc_root: str = "/proc"
    py_spy: str | None = None
    stacks: bool = True
    jobs: frozenset[str] = frozenset()
    own_pid_namespace: bool = False
    nccl_ras: bool = True
    # host:port of NCCL's RAS listener; None: the ranks' NCCL_RAS_ADDR, else NCCL's default.
    nccl_ras_addr: str | None = None
    flight_recorder: bool = True
    # Secret-name regexes beyond the defaults (--redact-pattern), and whether the defaults apply.
    redact_patterns: tuple[str, ...] = ()
    default_redaction: bool = True
    # Sending (agent/sender.py): the bearer token's file and the CA bundle for https monitors.
    token_file: str | None = None
    ca_file: str | None = None
    # Where the outage journal is kept on disk (agent/outage_journal.py); None: in memory only.
    outage_journal_dir: str | None = None
    # py-spy on other users' processes too (agent/targets.py); off: only the agent's own user's.
    dump_other_users: bool = False
    # Self-limits (agent/selfwatch.py); None: no cap.
    max_rss_mb: int | None = DEFAULT_MAX_RSS_MB
    max_cpu_percent: float | None = DEFAULT_MAX_CPU_PERCENT
    nice: int = 0  # the loop's nice value at least (agent/cli.py run_loop); 0: as started
    # Carry out the monitor's signal orders to culprit ranks (agent/signal_orders.py); off: refused.
    allow_signals: bool = False

    @property
    def monitor(self) -> str | None:
        """The first monitor given (the only one, unless sharded)."""
        return self.monitors[0] if self.monitors else None


@dataclass
class Tracked:
    proc: RankProcess
    discovered_at: float
    started_at: float | None
    alive: bool = True
    ended_at: float | None = None
    sample: ProcessSample | None = None
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


def boot_time(proc_root: str) -> float | None:
    try:
        with open(f"{proc_root}/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


@dataclass
class CollectorHealth:
    """Times each collector's run and turns its failure into a health entry, not a crash."""

    entries: dict[str, dict] = field(default_factory=dict)

    @contextmanager
    def run(self, name: str):
        started = time.monotonic()
        entry = {"name": name, "ok": True, "error": None, "duration_s": None}
        self.entries[name] = entry
        try:
            yield entry
        except Exception as e:  # noqa: BLE001 -- one collector must never stop the others
            log.debug("collector %s failed", name, exc_info=True)
            entry.update(ok=False, error=f"{type(e).__name__}: {e}"[:2048])
        finally:
            entry["duration_s"] = round(time.monotonic() - started, 4)

    def fail(self, name: str, error: str) -> None:
        self.entries[name].update(ok=False, error=error[:2048])


class Agent:
    def __init__(self, config: Config, clock=time.time, gpus: GpuCollector | None = None):
        self.config = config
        self.clock = clock
        self.started_at = clock()
        # Set for --once: collect everything now, as a person asking for one report expects.
        self.one_shot = False
        root = config.proc_root
        self.discovery = Discovery(
            proc_root=root, jobs=config.jobs, own_pid_namespace=config.own_pid_namespace,
            redactor=make_redactor(config.redact_patterns, config.default_redaction),
        )
        self.cpu = CpuSampler(root)
        self.io = WriteRateSampler(root)
        self.exits = ExitWatcher(root, clock)
        self.logs = LogFollower(root, config.logs, config.step_regex)
        py_spy = find_py_spy(config.py_spy) if config.stacks else None
        self.tracked: dict[int, Tracked] = {}
        # Ranks' torch worker servers (agent/torch_worker_server.py): stacks without ptrace, live Flight Recorder.
        self.worker_servers = WorkerServerFinder(root, self._env_of)
        self.stacks = (
            StackSampler(py_spy, root, dumper=Dumper.current(config.dump_other_users),
                         worker_server=self.worker_servers, clock=clock) if config.stacks else None
        )
        self.selfwatch = SelfWatch(Limits(
            max_rss_bytes=config.max_rss_mb * 2**20 if config.max_rss_mb else None,
            max_cpu_percent=config.max_cpu_percent,
        ))
        self.exit_status = 0  # what the loop ended with: EXIT_OVER_MEMORY past --max-rss-mb
        self.boot_time = boot_time(root)
        self.sockets = SocketReader(root)
        self.gpus = gpus if gpus is not None else GpuCollector()
        self.launchers = LauncherTracker(
            root, self.exits, self.sockets, self.stacks, self.boot_time, CLOCK_TICKS, config.jobs
        )
        self.health = CollectorHealth()
        self.host: dict = {}
        with self.health.run("host"):  # host facts do not change: collected once
            self.host = collect_host(root)
        self._host_health = self.health.entries["host"]
        self.gpu_reports: dict[int, list[dict]] = {}
        self.orphans: list[dict] = []
        self._orphans_at: float | None = None
        self._sockets_at: float | None = None
        self._interfaces_at: float | None = None
        self.nccl_ras = NcclRasPoller(clock) if config.nccl_ras else None
        self._nccl_ras_at: float | None = None
        self.flight_recorder = (FlightRecorderReader(root, live=self.worker_servers) if config.flight_recorder
                                else None)
        self.orders = SignalOrders(config.allow_signals, self._rank_target, root)
        self.capturer = Capturer(root, self._capture_facts, self._capture_stack, self._capture_flight_recorder,
                                 self.logs.files_of, lambda: self.nccl_ras.result() if self.nccl_ras else None,
                                 config.node)

    def start(self) -> None:
        self.exits.start()

    def close(self) -> None:
        self.exits.stop()
        self.logs.close()
        self.launchers.close()
        if self.stacks:
            self.stacks.close()

    def agent_info(self) -> dict:
        return {
            "version": version(),
            "pid": os.getpid(),
            "started_at": self.started_at,
            "interval_s": self.config.interval,
            "py_spy": self.stacks.status if self.stacks else "disabled (--no-stacks)",
            # The agent's own use (py-spy's included), sampled at the start of each tick.
            "cpu_percent": self.selfwatch.usage.cpu_percent,
            "rss_bytes": self.selfwatch.usage.rss_bytes,
        }

    # --- one tick --------------------------------------------------------------------

    def tick(self, schedule_stacks: bool = True) -> dict:
        now = self.clock()
        self.selfwatch.sample()
        backing_off = self.selfwatch.back_off() if schedule_stacks else None
        self.health = CollectorHealth()
        with self.health.run("discovery"):
            self._discover(now)
        alive = [t for t in self.tracked.values() if t.alive]
        with self.health.run("procstat") as entry:
            self._per_rank(alive, entry, lambda t: self._sample_cpu(t, now))
        with self.health.run("exits"):
            self._collect_exits(now)
        alive = [t for t in self.tracked.values() if t.alive]
        with self.health.run("procio") as entry:
            self._per_rank(alive, entry, lambda t: self._sample_io(t, now))
        with self.health.run("logs"):
            self._follow_logs(now)
        # Which ranks look stuck, once a tick (after its log lines): the stack plan and the live
        # Flight Recorder read both ask.
        stuck = {t.proc.pid for t in alive if looks_stuck(now, self.logs.progress_of(t.proc.pid), t.low_cpu_since)}
        # Ranks whose stacks the monitor's own clock needs: stuck by their log, parked by their CPU,
        # and the ranks of a job one of whose ranks here is parked (Python dumps only, for those at
        # work): a rank that evaluates or saves while its peers wait at a barrier must show its phase
        # even when its log says nothing for minutes (a job that logs every 100th step).
        parked_here = {t.proc.pid for t in alive if parked(now, t.low_cpu_since, t.worked)}
        parked_jobs = {t.proc.identity.job_id for t in alive if t.proc.pid in parked_here}
        beside_parked = {t.proc.pid for t in alive if t.proc.identity.job_id in parked_jobs} - parked_here - stuck
        dump = stuck | parked_here | beside_parked
        with self.health.run("blocked_io") as entry:
            self._per_rank(alive, entry, lambda t: self._sample_blocked_io(t, t.proc.pid in dump))
        self.sockets.new_sweep()
        sockets_due = self._sockets_at is None or now - self._sockets_at >= SOCKETS_EVERY_S
        if sockets_due:
            self._sockets_at = now
        with self.health.run("sockets") as entry:
            self._per_rank(alive, entry, lambda t: self._sample_sockets(t, now, sockets_due))
        with self.health.run("errorfiles"):
            self._read_error_files()
        with self.health.run("launchers") as entry:
            problems = self.launchers.update(
                self.discovery.launchers, self.discovery.workers, now,
                dump=bool(self.stacks and schedule_stacks and not backing_off), sockets_due=sockets_due,
            )
            if problems:
                entry.update(ok=False, error="; ".join(problems)[:2048])
        if self._orphans_at is None or now - self._orphans_at >= ORPHANS_EVERY_S:
            with self.health.run("orphans"):
                self._orphans_at = now
                self._collect_orphans()
        if self.gpus.available:
            with self.health.run("gpus"):
                self.gpu_reports = {}  # a failed sweep reports none rather than stale ones
                self.gpu_reports = self.gpus.collect([t.proc for t in alive])
        if self._interfaces_at is None or now - self._interfaces_at >= INTERFACES_EVERY_S:
            with self.health.run("interfaces"):
                self._interfaces_at = now
                self.host = {**self.host, "interfaces": collect_interfaces()}
        if self.stacks and schedule_stacks:
            with self.health.run("stacks") as entry:
                if backing_off:
                    entry.update(ok=False, error=backing_off)
                else:
                    self._schedule_stacks(alive, dump, now, python_only=beside_parked)
        if self.nccl_ras is not None:
            self._poll_nccl_ras(alive, now)
        if self.flight_recorder is not None:
            with self.health.run("flight_recorder"):
                # Ended ranks too: NCCL's watchdog writes the dump as the rank gives up.
                self.flight_recorder.collect_soon(
                    [(t.proc.pid, t.proc.identity.rank, t.proc.env, t.started_at) for t in self.tracked.values()], now,
                    stuck=stuck,
                )
                if self.flight_recorder.failure:
                    raise RuntimeError(self.flight_recorder.failure)
        self._drop_old_exits(now)
        return self.report(now)

    def _sample_sockets(self, t: Tracked, now: float, due: bool) -> None:
        young = now - t.discovered_at < SOCKETS_YOUNG_S
        if due or young or looks_stuck(now, self.logs.progress_of(t.proc.pid), t.low_cpu_since):
            t.sockets = [e.report() for e in self.sockets.sockets_of(t.proc.pid)]
            t.sockets_at = now

    def _poll_nccl_ras(self, alive: list[Tracked], now: float) -> None:
        """Start a poll of NCCL's RAS service when due; its answer is picked up by a later report."""
        if not alive:
            if self.nccl_ras.result() is not None:  # a node that never had ranks says nothing
                self.nccl_ras.note("no ranks")
            self._nccl_ras_at = None
            return
        # Only while a rank here looks stuck: each poll makes NCCL gather from every process of
        # the job, every node's agent polls, and counts that still move say nothing anyway.
        # A one-shot report (--once: a person asking now) polls whatever the ranks look like.
        stuck = any(looks_stuck(now, self.logs.progress_of(t.proc.pid), t.low_cpu_since) for t in alive)
        if not (stuck or self.one_shot):
            return
        if self._nccl_ras_at is not None and now - self._nccl_ras_at < NCCL_RAS_STUCK_EVERY_S:
            return
        with self.health.run("nccl_ras") as entry:
            self._nccl_ras_at = now
            envs = [t.proc.env for t in alive]
            if all(e.get("NCCL_RAS_ENABLE", "").strip() == "0" for e in envs):
                self.nccl_ras.note("off in the ranks' environment (NCCL_RAS_ENABLE=0)")
                return
            address = choose_address(self.config.nccl_ras_addr, envs)
            if address is None:
                self.nccl_ras.note("unreadable NCCL_RAS_ADDR")
                return
            root = self.config.proc_root
            pids = pid_map((t.proc.pid for t in alive), lambda pid: namespace_pid(root, pid))
            hosts = {a for i in self.host.get("interfaces", []) for a in i.get("addresses", [])}
            self.nccl_ras.start(address, pids, hosts)
            if self.nccl_ras.failure:
                entry.update(ok=False, error=self.nccl_ras.failure)

    def _read_error_files(self) -> None:
        """Once per exit: what @record wrote (retried for a few ticks if not there yet)."""
        for t in self.tracked.values():
            path = t.proc.env.get("TORCHELASTIC_ERROR_FILE")
            if t.alive or not path or t.error_file or t.error_file_tries >= ERROR_FILE_TRIES:
                continue
            t.error_file_tries += 1
            t.error_file = read_error_file(path)

    def _collect_orphans(self) -> None:
        """PPID-1 leftovers: launchers and processes with a rank's environment, plus any other
        PPID-1 process listening on a master port a launcher or rank here wants (the stale
        holder behind EADDRINUSE, whatever its command line)."""
        out = []
        mine: list[OrphanProcess] = []
        others: list[tuple[int, int]] = []
        for o in self.discovery.orphans:
            if self._orphan_wanted(o):
                mine.append(o)
            else:
                others.append((o.pid, o.starttime))
        for o in mine[:64]:
            try:
                ports = listening_ports(self.sockets.sockets_of(o.pid))
            except OSError:
                ports = []
            out.append(orphan_report(o, self._started(o.starttime), ports))
        known = {o["pid"] for o in out}
        # Another job's leftover still counts when it holds a port this job wants.
        for pid, starttime, ports in self._master_port_holders(self.discovery.other_ppid1 + others):
            if pid not in known and len(out) < 64:
                proc = OrphanProcess(pid, starttime, self.discovery.cmdline_of(pid))
                out.append(orphan_report(proc, self._started(starttime), ports))
        self.orphans = out

    def _orphan_wanted(self, orphan: OrphanProcess) -> bool:
        """With --job, leave out leftovers that belong to another job (those of an unknown
        job stay: one may hold a port this job wants)."""
        if not self.config.jobs:
            return True
        if orphan.rank is not None:
            job = orphan.rank.identity.job_id
        elif orphan.launcher is not None:
            job = launcher_job_id(parse_launcher_args(orphan.launcher.argv, orphan.launcher.env))
        else:
            job = None
        return job is None or job in self.config.jobs

    def _started(self, starttime: int) -> float | None:
        return self.boot_time + starttime / CLOCK_TICKS if self.boot_time is not None else None

    def _master_port_holders(self, candidates: list[tuple[int, int]]) -> list[tuple[int, int, list[int]]]:
        """(pid, starttime, its listening ports) of the candidates (PPID-1 processes) listening on
        a wanted port.

        Cheap when nothing is wrong: the fds of PPID-1 processes are only read when a LISTEN
        socket on a wanted port belongs to none of our launchers and ranks.
        """
        wanted: dict[int, int] = {}  # port -> a pid whose namespace to look in
        owners = []
        me = os.getpid()  # an ended process's namespace is unknown: look in the node's
        for t in self.launchers.tracked.values():
            if t.args.master_port:
                wanted.setdefault(t.args.master_port, t.proc.pid if t.alive else me)
            if t.alive:
                owners.append(t.proc.pid)
        for t in self.tracked.values():
            port = t.proc.env.get("MASTER_PORT", "")
            if port.isdigit():
                wanted.setdefault(int(port), t.proc.pid if t.alive else me)
            if t.alive:
                owners.append(t.proc.pid)
        if not wanted:
            return []
        listening: dict[int, int] = {}  # inode -> port
        for port, pid in wanted.items():
            try:
                table = self.sockets.table_of(pid)
            except OSError:
                continue
            listening.update({i: e.local_port for i, e in table.items() if e.state == "LISTEN" and e.local_port == port})
        for pid in owners:
            try:
                for inode in socket_inodes(self.config.proc_root, pid):
                    listening.pop(inode, None)
            except OSError:
                continue
        if not listening:
            return []
        holders = []
        for pid, starttime in candidates:
            try:
                inodes = set(socket_inodes(self.config.proc_root, pid))
            except OSError:
                continue
            if inodes & listening.keys():
                try:
                    ports = listening_ports(self.sockets.sockets_of(pid))
                except OSError:
                    ports = sorted({listening[i] for i in inodes & listening.keys()})
                holders.append((pid, starttime, ports))
        return holders

    def _per_rank(self, ranks: list[Tracked], entry: dict, sample) -> None:
        denied = []
        for t in ranks:
            try:
                sample(t)
            except VANISHED:
                continue  # exited mid-sample: the exit collector reports it
            except PermissionError as e:
                denied.append(f"pid {t.proc.pid}: {e.strerror}")
        if denied:
            entry.update(ok=False, error="; ".join(denied)[:2048])

    def _discover(self, now: float) -> None:
        for proc in self.discovery.scan():
            known = self.tracked.get(proc.pid)
            if known and known.proc.starttime == proc.starttime:
                continue
            if known:  # pid reused by a new rank: the old one is long gone
                self._forget(proc.pid)
            started = (
                self.boot_time + proc.starttime / CLOCK_TICKS if self.boot_time is not None else None
            )
            self.tracked[proc.pid] = Tracked(proc, now, started)
            self.exits.watch(proc.pid, proc.starttime)
            log.info(
                "tracking rank %d/%d of job %s (pid %d)",
                proc.identity.rank, proc.identity.world_size, proc.identity.job_id, proc.pid,
            )

    def _sample_cpu(self, t: Tracked, now: float) -> None:
        pid = t.proc.pid
        try:
            sample = self.cpu.sample(pid, now)
        except VANISHED:
            if not self.exits.available:  # fallback: no pidfd told us the exact time
                self.exits.record(pid, exit_from_stat(self.config.proc_root, pid, t.proc.starttime, now))
            raise
        if sample.state in ("Z", "X") and self.exits.exit_of(pid) is None:
            self.exits.record(pid, exit_from_stat(self.config.proc_root, pid, t.proc.starttime, now))
        t.sample = sample
        if sample.cpu_percent is not None and sample.cpu_percent < LOW_CPU_PERCENT:
            t.low_cpu_since = t.low_cpu_since or now
        elif sample.cpu_percent is not None:
            t.low_cpu_since = None
            t.worked = True

    def _sample_blocked_io(self, t: Tracked, stuck: bool) -> None:
        # A rank at work is in no blocking call worth naming: read only while it looks stuck (a
        # line of /proc, and a path from its memory only while it sits in an open).
        state = t.sample.state if t.sample else None
        t.blocked_io = read_blocked_io(self.config.proc_root, t.proc.pid, state=state) if stuck else None

    def _sample_io(self, t: Tracked, now: float) -> None:
        t.wchar, t.write_rate = self.io.sample(t.proc.pid, now)

    def _collect_exits(self, now: float) -> None:
        for t in self.tracked.values():
            if t.alive and self.exits.exit_of(t.proc.pid) is not None:
                t.alive, t.ended_at = False, now
                ex = self.exits.exit_of(t.proc.pid)
                log.info(
                    "rank %d of job %s (pid %d) exited: code=%s signal=%s",
                    t.proc.identity.rank, t.proc.identity.job_id, t.proc.pid, ex["code"], ex["signal"],
                )

    def _follow_logs(self, now: float) -> None:
        failures = self.logs.collect([t.proc for t in self.tracked.values()], now)
        for failure in failures:
            if failure.pid in self.tracked:
                self.exits.fill_from_launcher(failure.pid, failure.exitcode)

    def _schedule_stacks(self, alive: list[Tracked], stuck: set[int], now: float,
                         python_only: frozenset[int] | set[int] = frozenset()) -> None:
        for t in alive:
            self.stacks.schedule(t.proc.pid, now, t.proc.pid in stuck, t.sample.state if t.sample else None,
                                 python_only=t.proc.pid in python_only)
        if self.stacks.status != "ok":
            self.health.fail("stacks", self.stacks.status)
        elif self.stacks.recent_failures >= 3:
            self.health.fail("stacks", f"{self.stacks.recent_failures} dumps failed in a row")

    def dump_all_now(self) -> None:
        """Synchronous dumps of every running rank (for --once)."""
        if not self.stacks:
            return
        with self.health.run("stacks"):
            for t in self.tracked.values():
                if t.alive and t.sample and t.sample.state not in ("T", "t", "Z", "X"):
                    self.stacks.dump_now(t.proc.pid)
            self.launchers.dump_idle_now(self.clock())
            if self.stacks.status != "ok":
                self.health.fail("stacks", self.stacks.status)

    def _drop_old_exits(self, now: float) -> None:
        for pid in [p for p, t in self.tracked.items() if t.ended_at and now - t.ended_at > EXITED_KEPT_S]:
            self._forget(pid)
        self.launchers.drop_ended(now, EXITED_KEPT_S)

    def _forget(self, pid: int) -> None:
        self.tracked.pop(pid, None)
        self.cpu.forget(pid)
        self.io.forget(pid)
        self.exits.forget(pid)
        self.logs.forget(pid)
        if self.stacks:
            self.stacks.forget(pid)
        if self.flight_recorder is not None:
            self.flight_recorder.forget(pid)
        self.worker_servers.forget(pid)

    def take_orders(self, orders: object, sender: Any) -> None:
        """The orders in a monitor's answer (from the sending thread): captures, signals."""
        if not isinstance(orders, list):
            return
        signals = []
        for order in orders:
            if isinstance(order, dict) and isinstance(order.get("id"), str) and "capture" in order:
                self.capturer.take(order, sender.upload)
            else:
                signals.append(order)
        if signals:
            self.orders.take(signals)

    def _capture_facts(self, pid: int) -> dict | None:
        t = self.tracked.get(pid)
        if t is None:
            return None
        return {"rank": t.proc.identity.rank, "pid": pid, "job_id": t.proc.identity.job_id, "alive": t.alive,
                "state": t.sample.state if t.sample else None,
                "cpu_percent": t.sample.cpu_percent if t.sample else None, "exit": self.exits.exit_of(pid)}

    def _capture_stack(self, pid: int) -> dict:
        """A native dump; if py-spy's native unwinding fails (it does, now and then), a Python one,
        with the native failure said."""
        if self.stacks is None:
            raise StackError("stacks are off (--no-stacks)")
        try:
            return self.stacks.take_now(pid, native=True)
        except StackError as native_failed:
            stack = self.stacks.take_now(pid, native=False)
            return {**stack, "native_error": str(native_failed)[:512]}

    def _capture_flight_recorder(self, pid: int) -> dict | None:
        server = self.worker_servers(pid)
        if server is not None:
            try:
                return server.flight_recorder(time.time())
            except StackError:
                pass
        return self.flight_recorder.latest(pid) if self.flight_recorder else None

    def _env_of(self, pid: int) -> dict[str, str] | None:
        """A tracked live rank's allowlisted environment (called from worker threads)."""
        t = self.tracked.get(pid)
        return t.proc.env if t is not None and t.alive else None

    def _rank_target(self, pid: int) -> RankTarget | None:
        """The live rank with ``pid``, for a signal order (called from the sending thread)."""
        t = self.tracked.get(pid)
        if t is None or not t.alive:
            return None
        return RankTarget(pid, t.proc.identity.job_id, t.proc.identity.rank, t.proc.starttime, t.started_at)

    # --- the report ------------------------------------------------------------------

    def report(self, now: float) -> dict:
        ranks = []
        for t in sorted(self.tracked.values(), key=lambda t: (t.proc.identity.job_id, t.proc.identity.rank, t.alive, t.proc.pid)):
            pid = t.proc.pid
            stack, stack_error = self.stacks.latest(pid) if self.stacks else (None, None)
            ranks.append(
                rank_report(
                    t.proc,
                    alive=t.alive,
                    exit=self.exits.exit_of(pid),
                    started_at=t.started_at,
                    sample=t.sample,
                    wchar=t.wchar,
                    write_rate=t.write_rate,
                    progress=self.logs.progress_of(pid),
                    log_phase=self.logs.phase_of(pid),
                    log_errors=self.logs.errors_of(pid),
                    stack=stack,
                    stack_error=stack_error,
                    sockets=t.sockets if t.alive else [],
                    error_file=t.error_file,
                    dtype=self.logs.dtype_of(pid),
                    gpus=self.gpu_reports.get(pid, []) if t.alive else [],
                    flight_recorder=self.flight_recorder.latest(pid) if self.flight_recorder else None,
                    blocked_io=t.blocked_io if t.alive else None,
                )
            )
        gpu_health = self.gpus.health()
        return build_report(
            node=self.config.node,
            now=now,
            agent=self.agent_info(),
            host=self.host,
            collectors=[self._host_health] + list(self.health.entries.values()) + ([gpu_health] if gpu_health else []),
            ranks=ranks,
            launchers=self.launchers.reports(),
            orphans=self.orphans,
            nccl_ras=self.nccl_ras.result() if self.nccl_ras else None,
            order_results=self.orders.results(),
        )

    # --- the loop --------------------------------------------------------------------

    def run(self, stop: threading.Event, sender, notifier: Notifier | None = None) -> None:
        notifier = notifier or Notifier.from_env()
        next_tick = time.monotonic()
        ready = False
        while not stop.is_set():
            try:
                report = self.tick()
                sender.offer(report)
                if not ready:
                    notifier.ready(f"watching {len(report['ranks'])} ranks")
                    ready = True
            except Exception:  # noqa: BLE001 -- the loop itself must survive anything
                log.exception("tick failed")
            too_big = self.selfwatch.must_exit()
            if too_big:
                log.error("%s", too_big)
                self.exit_status = EXIT_OVER_MEMORY
                break
            # Fed from the sampling loop itself: a loop that hangs starves the watchdog.
            notifier.tick()
            next_tick += self.config.interval
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (a slow tick): do not try to catch up
                next_tick, delay = time.monotonic(), 0
            stop.wait(delay)
        notifier.stopping()
