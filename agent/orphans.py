"""The orphans collector: PPID-1 leftovers of earlier runs, and whatever holds a port a job here wants."""

from __future__ import annotations

import os

from agent.collectors import NotDue
from agent.discovery import Discovery, OrphanProcess
from agent.launchers import LauncherTracker, launcher_job_id, parse_launcher_args
from agent.procstat import start_time
from agent.report import orphan_report
from agent.sockets import SocketReader, listening_ports, socket_inodes
from agent.tick import NodeFindings, Tick, Tracked

ORPHANS_EVERY_S = 5.0
MAX_ORPHANS = 64


class Orphans:
    def __init__(self, discovery: Discovery, sockets: SocketReader, launchers: LauncherTracker,
                 booted: float | None, proc_root: str, jobs: frozenset[str], node: NodeFindings):
        self.discovery, self.sockets, self.launchers = discovery, sockets, launchers
        self.booted, self.proc_root, self.jobs, self.node = booted, proc_root, jobs, node
        self._at: float | None = None

    def collect(self, tick: Tick) -> None:
        """Launchers and processes with a rank's environment, plus any other PPID-1 process listening on
        a master port a launcher or rank here wants (the stale holder behind EADDRINUSE, whatever its
        command line)."""
        if self._at is not None and tick.now - self._at < ORPHANS_EVERY_S:
            raise NotDue
        self._at = tick.now
        out = []
        mine: list[OrphanProcess] = []
        others: list[tuple[int, int]] = []
        for o in self.discovery.orphans:
            if self._wanted(o):
                mine.append(o)
            else:
                others.append((o.pid, o.starttime))
        for o in mine[:MAX_ORPHANS]:
            try:
                ports = listening_ports(self.sockets.sockets_of(o.pid))
            except OSError:
                ports = []
            out.append(orphan_report(o, start_time(self.booted, o.starttime), ports))
        known = {o["pid"] for o in out}
        # Another job's leftover still counts when it holds a port this job wants.
        for pid, starttime, ports in self._master_port_holders(tick.tracked, self.discovery.other_ppid1 + others):
            if pid not in known and len(out) < MAX_ORPHANS:
                proc = OrphanProcess(pid, starttime, self.discovery.cmdline_of(pid))
                out.append(orphan_report(proc, start_time(self.booted, starttime), ports))
        self.node.orphans = out

    def _wanted(self, orphan: OrphanProcess) -> bool:
        """With --job, leave out leftovers that belong to another job (those of an unknown
        job stay: one may hold a port this job wants)."""
        if not self.jobs:
            return True
        if orphan.rank is not None:
            job = orphan.rank.identity.job_id
        elif orphan.launcher is not None:
            job = launcher_job_id(parse_launcher_args(orphan.launcher.argv, orphan.launcher.env))
        else:
            job = None
        return job is None or job in self.jobs

    def _master_port_holders(self, tracked: dict[int, Tracked],
                             candidates: list[tuple[int, int]]) -> list[tuple[int, int, list[int]]]:
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
        for t in tracked.values():
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
                for inode in socket_inodes(self.proc_root, pid):
                    listening.pop(inode, None)
            except OSError:
                continue
        if not listening:
            return []
        holders = []
        for pid, starttime in candidates:
            try:
                inodes = set(socket_inodes(self.proc_root, pid))
            except OSError:
                continue
            if inodes & listening.keys():
                try:
                    ports = listening_ports(self.sockets.sockets_of(pid))
                except OSError:
                    ports = sorted({listening[i] for i in inodes & listening.keys()})
                holders.append((pid, starttime, ports))
        return holders
