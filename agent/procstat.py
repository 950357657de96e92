"""Process and thread CPU, state and memory from /proc/PID/stat and /proc/PID/task/*/stat.

The parsers are pure (text in, values out); the readers take the proc root as a
parameter so tests can point them at fixture trees.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
BUSIEST_THREADS = 5


@dataclass(frozen=True)
class Stat:
    pid: int
    comm: str
    state: str
    ppid: int
    utime: int  # clock ticks
    stime: int
    num_threads: int
    starttime: int  # clock ticks after boot; (pid, starttime) names one process for good
    rss_pages: int
    exit_code: int | None  # a wait status, only meaningful for a zombie (Linux >= 3.5)

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime


def parse_stat(text: str) -> Stat:
    """Parse one /proc/PID/stat (or task stat) line.

    comm may hold spaces and parentheses, so split at the first "(" and the *last* ")".
    """
    head, _, tail = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    rest = tail.split()
    if not rest:
        raise ValueError(f"not a stat line: {text[:80]!r}")

    def field_no(n: int) -> int:  # 1-based field number as in proc(5)
        return int(rest[n - 3])

    return Stat(
        pid=int(pid_text),
        comm=comm,
        state=rest[0],
        ppid=field_no(4),
        utime=field_no(14),
        stime=field_no(15),
        num_threads=field_no(20),
        starttime=field_no(22),
        rss_pages=field_no(24),
        exit_code=field_no(52) if len(rest) >= 50 else None,
    )


def wait_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from a wait status: exactly one of them is set."""
    sig = status & 0x7F
    if sig:
        return None, sig
    return (status >> 8) & 0xFF, None


def read_stat(proc_root: str, pid: int) -> Stat:
    with open(f"{proc_root}/{pid}/stat") as f:
        return parse_stat(f.read())


# An open file's access mode and flags, as /proc/PID/fdinfo/FD's "flags:" line gives them (octal).
O_ACCMODE, O_WRONLY, O_RDWR, O_APPEND = 0o3, 0o1, 0o2, 0o2000


def open_flags(proc_root: str, pid: int, fd: int | str) -> int | None:
    """The flags ``pid`` opened ``fd`` with; None when it is gone (or not ours to read)."""
    try:
        with open(f"{proc_root}/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def opened_for_writing(flags: int | None) -> bool:
    return flags is not None and (flags & O_ACCMODE) in (O_WRONLY, O_RDWR)


# How far up the process tree a rank's launcher, shell or helper is looked for.
ANCESTOR_LEVELS = 6


def ancestors(pid: int, parent_of: Callable[[int], int | None], levels: int = ANCESTOR_LEVELS) -> Iterator[int]:
    """``pid``'s parent, its parent's parent, ... at most ``levels`` of them, ending before pid 1
    (init adopts orphans: it is nobody's launcher) or a parent ``parent_of`` does not know (None)."""
    for _ in range(levels):
        parent = parent_of(pid)
        if parent is None or parent <= 1:
            return
        yield parent
        pid = parent


def read_thread_stats(proc_root: str, pid: int) -> list[Stat]:
    out = []
    try:
        tids = os.listdir(f"{proc_root}/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            with open(f"{proc_root}/{pid}/task/{tid}/stat") as f:
                out.append(parse_stat(f.read()))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # thread ended between listdir and open
    return out


def cpu_percent(ticks_before: int, ticks_now: int, wall_seconds: float) -> float | None:
    """CPU use over an interval; 100 means one full core."""
    if wall_seconds <= 0 or ticks_now < ticks_before:
        return None
    return round((ticks_now - ticks_before) / CLOCK_TICKS / wall_seconds * 100.0, 1)


@dataclass
class ProcessSample:
    state: str
    cpu_percent: float | None
    cpu_seconds: float
    rss_bytes: int
    threads: dict  # ThreadsReport shape


def summarize_threads(
    threads: list[Stat], rates: dict[int, float | None], busiest: int = BUSIEST_THREADS, main_tid: int | None = None
) -> dict:
    """The ThreadsReport dict: totals by state, the busiest few threads, the main thread's CPU
    (``main_tid``: the process's pid, which its main thread's tid is)."""
    by_state: dict[str, int] = {}
    for t in threads:
        by_state[t.state] = by_state.get(t.state, 0) + 1
    ranked = sorted(threads, key=lambda t: (rates.get(t.pid) or 0.0, t.cpu_ticks), reverse=True)
    return {
        "total": len(threads),
        "by_state": by_state,
        # The main thread (its tid is the pid): where training code runs. 0 while it
        # sits in a collective or a blocked call, however busy the side threads (monitor.ingest.rank_ingest).
        "main_cpu_percent": rates.get(main_tid) if main_tid is not None else None,
        "busiest": [
            {"tid": t.pid, "name": t.comm[:256], "state": t.state, "cpu_percent": rates.get(t.pid)}
            for t in ranked[:busiest]
        ],
    }


@dataclass
class CpuSampler:
    """Turns successive stat readings into CPU rates; keeps one previous reading per thread."""

    proc_root: str = "/proc"
    # pid -> {tid (0 for the whole process) -> (cpu ticks, wall time)}
    _prev: dict[int, dict[int, tuple[int, float]]] = field(default_factory=dict)

    def sample(self, pid: int, now: float) -> ProcessSample:
        stat = read_stat(self.proc_root, pid)
        threads = read_thread_stats(self.proc_root, pid)
        prev = self._prev.get(pid, {})
        current = {0: (stat.cpu_ticks, now)} | {t.pid: (t.cpu_ticks, now) for t in threads}
        self._prev[pid] = current  # dropping threads that ended

        def rate(tid: int) -> float | None:
            if tid not in prev:
                return None
            return cpu_percent(prev[tid][0], current[tid][0], now - prev[tid][1])

        return ProcessSample(
            state=stat.state,
            cpu_percent=rate(0),
            cpu_seconds=round(stat.cpu_ticks / CLOCK_TICKS, 2),
            rss_bytes=stat.rss_pages * PAGE_SIZE,
            threads=summarize_threads(threads, {t.pid: rate(t.pid) for t in threads}, main_tid=pid),
        )

    def forget(self, pid: int) -> None:
        self._prev.pop(pid, None)


def uptime_ticks(proc_root: str = "/proc") -> int | None:
    """Clock ticks since boot (the unit of a process's start time); None where it cannot be read."""
    try:
        with open(f"{proc_root}/uptime") as f:
            return int(float(f.read().split()[0]) * CLOCK_TICKS)
    except (OSError, ValueError, IndexError):
        return None


def boot_time(proc_root: str = "/proc") -> float | None:
    """The Unix time the node booted (/proc/stat's btime); None where it cannot be read."""
    try:
        with open(f"{proc_root}/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def start_time(booted: float | None, starttime: int) -> float | None:
    """A process's start as a Unix time, from its starttime (clock ticks after boot)."""
    return booted + starttime / CLOCK_TICKS if booted is not None else None
