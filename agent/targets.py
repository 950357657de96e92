"""Whom py-spy may dump: a pure rule on a few /proc facts, and their thin reader.

py-spy stops its target while it reads it, so it is pointed only at processes that are
(a) not the agent itself, its parent or its children (py-spy), (b) Python (py-spy fails on
anything else, after stopping it), and (c) the agent's own user's, unless the agent was
started with ``--dump-other-users``: a root agent on a shared node then stops only the jobs
it was told it may stop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.procinfo import is_python, read_argv, read_exe
from agent.procstat import read_stat


@dataclass(frozen=True)
class Target:
    """What the rule needs to know of a process."""

    pid: int
    ppid: int
    uids: tuple[int, ...] | None  # real, effective, saved, filesystem; None: unreadable
    exe: str  # /proc/PID/exe, "" when unreadable
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Dumper:
    """The agent, as the rule sees it."""

    pid: int
    ppid: int
    uid: int  # effective uid
    dump_other_users: bool = False

    @classmethod
    def current(cls, dump_other_users: bool = False) -> Dumper:
        return cls(os.getpid(), os.getppid(), os.geteuid(), dump_other_users)


def dump_refusal(target: Target, me: Dumper) -> str | None:
    """None when py-spy may dump the target; otherwise why not, in one line."""
    if target.pid == me.pid:
        return "not dumped: it is the agent itself"
    if target.pid == me.ppid:
        return "not dumped: it is the agent's parent"
    if target.ppid == me.pid:
        return "not dumped: it is the agent's child"
    if not is_python(target.exe, list(target.argv)):
        name = os.path.basename(target.exe or (target.argv[0] if target.argv else "")) or "unknown"
        return f"not dumped: not a Python process ({name[:64]})"
    if target.uids is None:
        return "not dumped: its owner is unknown"
    # The first of its ids that is not the agent's: a setuid process counts as another user's.
    other = next((u for u in target.uids[:3] if u != me.uid), None)
    if other is not None and not me.dump_other_users:
        return f"not dumped: process of uid {other} (start the agent with --dump-other-users)"
    return None


def parse_uids(status: str) -> tuple[int, ...] | None:
    """The Uid: line of /proc/PID/status."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            try:
                uids = tuple(int(u) for u in line.split()[1:])
            except ValueError:
                return None
            return uids if len(uids) >= 3 else None
    return None


def read_target(proc_root: str, pid: int) -> Target:
    """Raises OSError when the process is gone."""
    with open(f"{proc_root}/{pid}/status") as f:
        uids = parse_uids(f.read())
    return Target(
        pid=pid,
        ppid=read_stat(proc_root, pid).ppid,
        uids=uids,
        exe=read_exe(proc_root, pid),
        argv=tuple(read_argv(proc_root, pid)),
    )
