"""The agent: the readers its collectors share, the loop that runs the enabled collectors once a tick
(agent/collectors.py: each timed, its failure contained), and the report built from what they read."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from hangwatch_common.sdnotify import Notifier
from hangwatch_common.version import version
from agent import node_collectors, rank_collectors
from agent.capture import Capturer
from agent.collectors import Health, Registry
from agent.discovery import Discovery
from agent.exits import ExitWatcher
from agent.flight_recorder import FlightRecorderReader
from agent.gpus import GpuCollector
from agent.host import collect_host
from agent.launchers import LauncherTracker
from agent.logs import LogFollower
from agent.nccl_ras import NcclRasPoller
from agent.procio import WriteRateSampler
from agent.procstat import CLOCK_TICKS, CpuSampler, boot_time
from agent.redact import make_redactor
from agent.report import RankSignals, build_report, rank_report
from agent.sched import SchedSampler
from agent.selfwatch import (
    DEFAULT_MAX_CPU_PERCENT,
    DEFAULT_MAX_RSS_MB,
    EXIT_OVER_MEMORY,
    Limits,
    SelfWatch,
)
from agent.signal_orders import RankTarget, SignalOrders
from agent.sockets import SocketReader
from agent.stacks import StackError, StackSampler, find_py_spy
from agent.targets import Dumper
from agent.tcp_info import TcpInfoReader
from agent.tick import NodeFindings, Tick, Tracked
from agent.torch_worker_server import WorkerServerFinder

log = logging.getLogger(__name__)

EXITED_KEPT_S = 600.0


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


def default_registry() -> Registry:
    """Every collector, in the order a tick runs them: the ranks' own signals first."""
    registry = Registry()
    rank_collectors.register(registry)
    node_collectors.register(registry)
    return registry


def enabled_collectors(config: Config) -> dict[str, bool]:
    """The collectors the settings turn off (--no-stacks, --no-nccl-ras, --no-flight-recorder)."""
    return {"stacks": config.stacks, "nccl_ras": config.nccl_ras, "flight_recorder": config.flight_recorder}


class Agent:
    def __init__(self, config: Config, clock=time.time, gpus: GpuCollector | None = None,
                 registry: Registry | None = None):
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
        self.sched = SchedSampler(root)
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
        self.sockets = SocketReader(root, tcp_info=TcpInfoReader())
        self.gpus = gpus if gpus is not None else GpuCollector()
        self.launchers = LauncherTracker(
            root, self.exits, self.sockets, self.stacks, self.boot_time, CLOCK_TICKS, config.jobs
        )
        self.node = NodeFindings()
        self.host_health = Health()  # host facts do not change: collected once
        self.host_health.run("host", self._collect_host)
        self.health = Health()  # the last tick's
        self.nccl_ras = NcclRasPoller(clock) if config.nccl_ras else None
        self.flight_recorder = (FlightRecorderReader(root, live=self.worker_servers) if config.flight_recorder
                                else None)
        self.orders = SignalOrders(config.allow_signals, self._rank_target, root)
        self.capturer = Capturer(root, self._capture_facts, self._capture_stack, self._capture_flight_recorder,
                                 self.logs.files_of, lambda: self.nccl_ras.result() if self.nccl_ras else None,
                                 config.node)
        # Last: the collectors' factories take the readers above.
        self.collectors = (registry or default_registry()).build(self, enabled_collectors(config))

    def _collect_host(self) -> None:
        self.node.host = collect_host(self.config.proc_root)

    def start(self) -> None:
        self.exits.start()

    def close(self) -> None:
        self.exits.stop()
        self.logs.close()
        self.launchers.close()
        self.sockets.close()
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
        tick = Tick(now, self.tracked, self.logs.progress_of, one_shot=self.one_shot,
                    schedule_stacks=schedule_stacks, backing_off=backing_off)
        self.health = self.collectors.run(tick)
        self._drop_old_exits(now)
        return self.report(now)

    def dump_all_now(self) -> None:
        """Synchronous dumps of every running rank (for --once)."""
        if self.stacks:
            self.health.run("stacks", partial(node_collectors.dump_all_now, self.stacks, self.launchers,
                                              self.tracked, self.clock))

    def _drop_old_exits(self, now: float) -> None:
        for pid in [p for p, t in self.tracked.items() if t.ended_at and now - t.ended_at > EXITED_KEPT_S]:
            self.forget(pid)
        self.launchers.drop_ended(now, EXITED_KEPT_S)

    def forget(self, pid: int) -> None:
        self.tracked.pop(pid, None)
        self.cpu.forget(pid)
        self.sched.forget(pid)
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
        def order(t: Tracked) -> tuple:
            return t.proc.identity.job_id, t.proc.identity.rank, t.alive, t.proc.pid

        ranks = [rank_report(t.proc, self._signals(t)) for t in sorted(self.tracked.values(), key=order)]
        gpu_health = self.gpus.health()
        return build_report(
            node=self.config.node,
            now=now,
            agent=self.agent_info(),
            host=self.node.host,
            collectors=self.host_health.report() + self.health.report() + ([gpu_health] if gpu_health else []),
            ranks=ranks,
            launchers=self.launchers.reports(),
            orphans=self.node.orphans,
            nccl_ras=self.nccl_ras.result() if self.nccl_ras else None,
            order_results=self.orders.results(),
        )

    def _signals(self, t: Tracked) -> RankSignals:
        """The rank's record, with what the readers that keep their own (logs, stacks, exits, Flight
        Recorder) hold of it; an ended rank's sockets, GPUs and blocked call are no longer news."""
        pid = t.proc.pid
        stack, stack_error = self.stacks.latest(pid) if self.stacks else (None, None)
        return RankSignals(
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
            gpus=t.gpus if t.alive else [],
            flight_recorder=self.flight_recorder.latest(pid) if self.flight_recorder else None,
            blocked_io=t.blocked_io if t.alive else None,
            sched=t.sched,
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
