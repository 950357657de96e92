"""Exact exit times and statuses of tracked ranks.

One thread polls a pidfd per rank. A pidfd turns readable the moment the process
exits; it is then a zombie until its parent reaps it, and its /proc stat still
holds the wait status (field 52), so reading it at once usually wins the race
against the parent. The time matters more than the status: the rank that ended
first is the likely culprit and the others' failures are symptoms.

Without pidfd_open (old kernels, other OSes) the sampling loop notices a
vanished process instead, with the time of the sample that missed it.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable

from agent.procstat import read_stat, wait_status

log = logging.getLogger(__name__)


def exit_from_stat(proc_root: str, pid: int, starttime: int, at: float) -> dict:
    """The ExitReport dict for a process that just ended, from its zombie if still there."""
    try:
        stat = read_stat(proc_root, pid)
    except (OSError, ValueError):
        stat = None
    if stat and stat.starttime == starttime and stat.state in "ZX" and stat.exit_code is not None:
        code, sig = wait_status(stat.exit_code)
        return {"at": at, "code": code, "signal": sig, "source": "proc"}
    return {"at": at, "code": None, "signal": None, "source": "unknown"}


def launcher_status(exitcode: int) -> tuple[int | None, int | None]:
    """torchrun's "exitcode: -9" means killed by signal 9; otherwise it is the exit code."""
    return (None, -exitcode) if exitcode < 0 else (exitcode, None)


class ExitWatcher:
    def __init__(self, proc_root: str = "/proc", clock: Callable[[], float] = time.time):
        self.proc_root = proc_root
        self.clock = clock
        self.available = hasattr(os, "pidfd_open")
        self._lock = threading.Lock()
        self._fds: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, starttime)
        self._exits: dict[int, dict] = {}  # pid -> ExitReport dict
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.available:
            self._thread = threading.Thread(target=self._run, name="exit-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        if self._thread:
            self._thread.join(timeout=2)
        with self._lock:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()

    def watch(self, pid: int, starttime: int) -> bool:
        """Start watching; False when pidfds are unavailable (the caller polls instead)."""
        if not self.available:
            return False
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.record(pid, exit_from_stat(self.proc_root, pid, starttime, self.clock()))
            return True
        except OSError as e:  # ENOSYS in old kernels or seccomp'd containers
            log.warning("pidfd_open unavailable (%s); detecting exits by polling", e)
            self.available = False
            return False
        try:
            if read_stat(self.proc_root, pid).starttime != starttime:
                raise ProcessLookupError  # the pid was reused before we opened it
        except (OSError, ValueError):
            os.close(fd)
            self.record(pid, {"at": self.clock(), "code": None, "signal": None, "source": "unknown"})
            return True
        with self._lock:
            self._fds[fd] = (pid, starttime)
        os.write(self._wake_w, b"x")
        return True

    def record(self, pid: int, exit_report: dict) -> None:
        with self._lock:
            self._exits.setdefault(pid, exit_report)

    def exit_of(self, pid: int) -> dict | None:
        with self._lock:
            return self._exits.get(pid)

    def fill_from_launcher(self, pid: int, exitcode: int) -> None:
        """A launcher log named this pid's status: use it when /proc could not tell."""
        code, sig = launcher_status(exitcode)
        with self._lock:
            known = self._exits.get(pid)
            if known and known["source"] == "unknown":
                known.update(code=code, signal=sig, source="launcher-log")

    def forget(self, pid: int) -> None:
        with self._lock:
            self._exits.pop(pid, None)

    def _run(self) -> None:
        while not self._stop:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            with self._lock:
                watched = dict(self._fds)
            for fd in watched:
                poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll(1000):
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                at = self.clock()
                pid, starttime = watched[fd]
                self.record(pid, exit_from_stat(self.proc_root, pid, starttime, at))
                with self._lock:
                    self._fds.pop(fd, None)
                os.close(fd)
