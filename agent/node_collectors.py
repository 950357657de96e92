"""The collectors that follow the per-rank ones: launchers, leftovers, GPUs, interfaces, and the slow
evidence (stacks, NCCL's RAS view, Flight Recorder dumps) fetched for the ranks that look stuck."""

from __future__ import annotations

from collections.abc import Callable

from agent.collectors import NotDue, Registry
from agent.discovery import Discovery
from agent.flight_recorder import FlightRecorderReader
from agent.gpus import GpuCollector
from agent.host import collect_interfaces
from agent.launchers import LauncherTracker
from agent.nccl_ras import NcclRasPoller, choose_address, namespace_pid
from agent.nccl_ras_answer import pid_map
from agent.orphans import Orphans
from agent.stacks import STOPPED_STATES, StackSampler
from agent.tick import NodeFindings, Tick, Tracked

INTERFACES_EVERY_S = 30.0
# Each poll of NCCL's RAS service runs a collective over every NCCL process of the job, and
# every node's agent polls: only while a rank here looks stuck (when the answer matters).
NCCL_RAS_STUCK_EVERY_S = 3.0


class Launchers:
    def __init__(self, tracker: LauncherTracker, discovery: Discovery, stacks: bool):
        self.tracker, self.discovery, self.stacks = tracker, discovery, stacks

    def collect(self, tick: Tick) -> str | None:
        problems = self.tracker.update(
            self.discovery.launchers, self.discovery.workers, tick.now,
            dump=self.stacks and tick.schedule_stacks and not tick.backing_off, sockets_due=tick.sockets_due,
        )
        return "; ".join(problems) or None


class Gpus:
    def __init__(self, gpus: GpuCollector):
        self.gpus = gpus

    def collect(self, tick: Tick) -> None:
        if not self.gpus.available:  # said once, by GpuCollector.health
            raise NotDue
        alive = tick.alive
        for t in alive:  # a failed sweep reports none rather than stale ones
            t.gpus = []
        reports = self.gpus.collect([t.proc for t in alive])
        for t in alive:
            t.gpus = reports.get(t.proc.pid, [])


class Interfaces:
    def __init__(self, node: NodeFindings):
        self.node = node
        self._at: float | None = None

    def collect(self, tick: Tick) -> None:
        if self._at is not None and tick.now - self._at < INTERFACES_EVERY_S:
            raise NotDue
        self._at = tick.now
        self.node.host = {**self.node.host, "interfaces": collect_interfaces()}


def stacks_problem(sampler: StackSampler, recent_failures: bool = True) -> str | None:
    if sampler.status != "ok":
        return sampler.status
    if recent_failures and sampler.recent_failures >= 3:
        return f"{sampler.recent_failures} dumps failed in a row"
    return None


class Stacks:
    def __init__(self, sampler: StackSampler):
        self.sampler = sampler

    def collect(self, tick: Tick) -> str | None:
        if not tick.schedule_stacks:  # --once dumps every rank itself (dump_all_now)
            raise NotDue
        if tick.backing_off:
            return tick.backing_off
        plan = tick.plan
        for t in tick.alive:
            pid = t.proc.pid
            self.sampler.schedule(pid, tick.now, pid in plan.dump, t.sample.state if t.sample else None,
                                  python_only=pid in plan.python_only)
        return stacks_problem(self.sampler)


def dump_all_now(sampler: StackSampler, launchers: LauncherTracker, tracked: dict[int, Tracked],
                 clock: Callable[[], float]) -> str | None:
    """Synchronous dumps of every running rank and idle launcher (for --once)."""
    for t in tracked.values():
        if t.alive and t.sample and t.sample.state not in STOPPED_STATES:
            sampler.dump_now(t.proc.pid)
    launchers.dump_idle_now(clock())
    return stacks_problem(sampler, recent_failures=False)


class NcclRas:
    """Starts a poll of NCCL's RAS service when due; its answer is picked up by a later report."""

    def __init__(self, poller: NcclRasPoller, address: str | None, proc_root: str, node: NodeFindings):
        self.poller, self.address, self.proc_root, self.node = poller, address, proc_root, node
        self._at: float | None = None

    def collect(self, tick: Tick) -> str | None:
        alive = tick.alive
        if not alive:
            if self.poller.result() is not None:  # a node that never had ranks says nothing
                self.poller.note("no ranks")
            self._at = None
            raise NotDue
        # Only while a rank here looks stuck: each poll makes NCCL gather from every process of
        # the job, every node's agent polls, and counts that still move say nothing anyway.
        # A one-shot report (--once: a person asking now) polls whatever the ranks look like.
        if not (tick.plan.stuck or tick.one_shot):
            raise NotDue
        if self._at is not None and tick.now - self._at < NCCL_RAS_STUCK_EVERY_S:
            raise NotDue
        self._at = tick.now
        envs = [t.proc.env for t in alive]
        if all(e.get("NCCL_RAS_ENABLE", "").strip() == "0" for e in envs):
            self.poller.note("off in the ranks' environment (NCCL_RAS_ENABLE=0)")
            return None
        address = choose_address(self.address, envs)
        if address is None:
            self.poller.note("unreadable NCCL_RAS_ADDR")
            return None
        pids = pid_map((t.proc.pid for t in alive), lambda pid: namespace_pid(self.proc_root, pid))
        hosts = {a for i in self.node.host.get("interfaces", []) for a in i.get("addresses", [])}
        self.poller.start(address, pids, hosts)
        return self.poller.failure


class FlightRecorder:
    def __init__(self, reader: FlightRecorderReader):
        self.reader = reader

    def collect(self, tick: Tick) -> None:
        # Ended ranks too: NCCL's watchdog writes the dump as the rank gives up.
        ranks = [(t.proc.pid, t.proc.identity.rank, t.proc.env, t.started_at) for t in tick.tracked.values()]
        self.reader.collect_soon(ranks, tick.now, stuck=set(tick.plan.stuck))
        if self.reader.failure:
            raise RuntimeError(self.reader.failure)


def register(registry: Registry) -> None:
    """After the per-rank collectors, whose records and stack plan these read."""
    registry.register("launchers", lambda a: Launchers(a.launchers, a.discovery, a.stacks is not None))
    registry.register("orphans", lambda a: Orphans(a.discovery, a.sockets, a.launchers, a.boot_time,
                                                   a.config.proc_root, a.config.jobs, a.node))
    registry.register("gpus", lambda a: Gpus(a.gpus))
    registry.register("interfaces", lambda a: Interfaces(a.node))
    # The three below are the ones a flag turns off (--no-stacks, --no-nccl-ras, --no-flight-recorder).
    registry.register("stacks", lambda a: Stacks(a.stacks))
    registry.register("nccl_ras", lambda a: NcclRas(a.nccl_ras, a.config.nccl_ras_addr, a.config.proc_root, a.node))
    registry.register("flight_recorder", lambda a: FlightRecorder(a.flight_recorder))
