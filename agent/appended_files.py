"""Log files a rank opened itself: the regular files it holds open for appending.

Much of the world's training code logs to a file of its own and not to stdout: Python's
``logging.FileHandler`` (mode "a"), a framework's file logger, ``print(..., file=open(p, "a"))``.
Without this, such a job shows no progress unless it is given with ``--log``, and its stall is
found only by the slower no-progress rules. A file counts when the rank holds it open with
O_APPEND and write access, it is a regular file outside the kernel's trees (/proc, /sys, /dev)
and not deleted; text is checked by the follower (agent/logs.py stops reading a file once it
reads a NUL byte). A checkpoint is written with "wb" (O_TRUNC, no O_APPEND) and stays out.

A rank's fds are listed every second for its first ``YOUNG_S`` (code opens its log once
training starts, often after the agent found the rank, at import), then every ``RESCAN_S`` (a
torch rank holds a hundred fds or more); at most ``MAX_FILES_PER_RANK`` files each, lowest fd first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.procstat import O_APPEND, open_flags, opened_for_writing

RESCAN_S = 10.0
YOUNG_S, YOUNG_RESCAN_S = 60.0, 1.0
MAX_FILES_PER_RANK = 8
KERNEL_TREES = ("/proc/", "/sys/", "/dev/")


def is_appended_log(flags: int, target: str) -> bool:
    """Whether an fd opened with ``flags`` (fdinfo's, octal read) on ``target`` (its link) is a log
    the rank appends to."""
    if not flags & O_APPEND or not opened_for_writing(flags):
        return False
    if not target.startswith("/") or target.endswith(" (deleted)"):
        return False  # a pipe, socket or anon inode; or a file nobody can read any more by name
    return not target.startswith(KERNEL_TREES)


@dataclass
class _Scan:
    first_at: float
    at: float
    fds: tuple[tuple[int, str], ...]  # (fd, target)


class AppendedFiles:
    """Per rank, the fds (above stdout and stderr) of the logs it appends to."""

    def __init__(self, proc_root: str = "/proc", rescan_s: float = RESCAN_S) -> None:
        self.proc_root = proc_root
        self.rescan_s = rescan_s
        self._scans: dict[int, _Scan] = {}

    def of(self, pid: int, now: float) -> tuple[tuple[int, str], ...]:
        """(fd, path) of each log ``pid`` appends to, as of its latest scan."""
        scan = self._scans.get(pid)
        if scan is None:
            scan = self._scans[pid] = _Scan(now, now, self._scan(pid))
        elif now - scan.at >= (YOUNG_RESCAN_S if now - scan.first_at < YOUNG_S else self.rescan_s):
            scan.at, scan.fds = now, self._scan(pid)
        return scan.fds

    def forget(self, pid: int) -> None:
        self._scans.pop(pid, None)

    def _scan(self, pid: int) -> tuple[tuple[int, str], ...]:
        fd_dir = f"{self.proc_root}/{pid}/fd"
        try:
            fds = sorted(fd for fd in map(int, filter(str.isdigit, os.listdir(fd_dir))) if fd > 2)
        except OSError:  # gone, or not ours to read
            return ()
        found: list[tuple[int, str]] = []
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if not target.startswith("/") or target.startswith(KERNEL_TREES):
                continue  # cheap refusals first: most of a rank's fds are sockets, pipes, eventfds
            flags = open_flags(self.proc_root, pid, fd)
            if flags is not None and is_appended_log(flags, target):
                found.append((fd, target))
                if len(found) == MAX_FILES_PER_RANK:
                    break
        return tuple(found)
