"""Each rank's PyTorch Flight Recorder dump, read when the job writes one.

torch writes a rank's dump to ``<prefix><rank>`` (NCCL's watchdog on a timeout, or the job
itself: ``torch._C._distributed_c10d._dump_fr_trace()``). The prefix is the rank's
TORCH_FR_DUMP_TEMP_FILE, else TORCH_NCCL_DEBUG_INFO_TEMP_FILE, else torch's default
``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` (``$HOME/.cache/...`` without it; older
torch: ``/tmp/nccl_trace_rank_``). With TORCH_FR_DUMP_DYNAMIC_FILE_NAME the prefix is the
whole name. Recording is on unless the buffer size (TORCH_FR_BUFFER_SIZE, else
TORCH_NCCL_TRACE_BUFFER_SIZE; torch 2.13's default 2000) is 0.

A file is looked at every few seconds and read only when its mtime or size changed, never
over ``MAX_DUMP_BYTES``; a file older than the process is a previous run's and is skipped.
The path is read through /proc/PID/root (or cwd, for a relative prefix), so a rank in a
container is read in its own file system. agent/flight_recorder_dump.py parses (pure).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass

from agent.flight_recorder_dump import parse_dump
from agent.procinfo import read_environ

PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DEFAULT_BUFFER_SIZE = 2000
LEGACY_PREFIX = "/tmp/nccl_trace_rank_"
CHECK_EVERY_S = 2.0
# A stuck rank's worker server is asked for its live trace this often.
LIVE_EVERY_S = 5.0
MAX_DUMP_BYTES = 64 * 1024 * 1024
# Reading stops for this tick once this much time went on dumps (the rest wait a tick).
READ_BUDGET_S = 0.25
# A file this fresh that does not parse may be half written: look again before saying so.
SETTLE_S = 1.0
# A dump whose mtime is this much before the process started is a previous run's.
CLOCK_SLACK_S = 2.0


def recording(env: Mapping[str, str]) -> bool:
    """Whether torch records at all: a buffer size of 0 turns Flight Recorder off."""
    for name in BUFFER_VARS:
        value = env.get(name, "").strip()
        if value:
            return not value.lstrip("-").isdigit() or int(value) > 0  # unreadable: torch's default
    return DEFAULT_BUFFER_SIZE > 0


def dump_paths(env: Mapping[str, str], rank: int, home_env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Where the rank's dump may be (pure): the file its prefix names; without a prefix,
    torch's default (``home_env``: the rank's HOME and XDG_CACHE_HOME) and the older one."""
    if not recording(env):
        return ()
    prefix = next((env[n] for n in PREFIX_VARS if env.get(n)), None)
    if prefix is not None:
        dynamic = env.get("TORCH_FR_DUMP_DYNAMIC_FILE_NAME", "").strip().lower() in ("1", "true", "yes", "y", "on")
        return (prefix,) if dynamic and env.get("TORCH_FR_DUMP_TEMP_FILE") else (f"{prefix}{rank}",)
    home_env = home_env or {}
    cache = home_env.get("XDG_CACHE_HOME") or (home_env.get("HOME") or "/tmp") + "/.cache"
    return (f"{cache}/torch/comm_lib_trace_rank_{rank}", f"{LEGACY_PREFIX}{rank}")


def locations(proc_root: str, pid: int, path: str) -> tuple[str, ...]:
    """Where to open ``path`` as the rank sees it: in its root (or cwd) while it runs; as
    given only once it has exited (a container's rank must never be shown the host's file of
    the same name). A path that climbs with ".." is not followed at all: the environment that
    names it is the job's, and the agent reads as root."""
    if ".." in path.split("/"):
        return ()
    if os.path.exists(f"{proc_root}/{pid}"):
        return (f"{proc_root}/{pid}/root{path}",) if os.path.isabs(path) else (f"{proc_root}/{pid}/cwd/{path}",)
    return (path,) if os.path.isabs(path) else ()


@dataclass
class _RankDump:
    paths: tuple[str, ...]
    checked_at: float | None = None
    key: tuple[str, int, int] | None = None  # (file, mtime_ns, size) last read
    report: dict | None = None
    live_at: float | None = None  # when the rank's worker server was last asked


class FlightRecorderReader:
    """The latest dump of each rank, as the report's ``flight_recorder`` (monitor/ingest/wire.py
    ``FlightRecorderReport``): kept once read, also after the file is gone or the rank ended."""

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        every_s: float = CHECK_EVERY_S,
        max_bytes: int = MAX_DUMP_BYTES,
        budget_s: float = READ_BUDGET_S,
        monotonic: Callable[[], float] = time.monotonic,
        live: Callable[[int], Any] | None = None,
    ) -> None:
        self.proc_root = proc_root
        # A rank's torch worker server (agent/torch_worker_server.py): its trace read live while it
        # looks stuck, every LIVE_EVERY_S (it serializes the ring buffer in the rank's process).
        self.live = live
        self._stuck: set[int] = set()
        self.every_s = every_s
        self.max_bytes = max_bytes
        self.budget_s = budget_s
        self._monotonic = monotonic
        self._ranks: dict[int, _RankDump] = {}
        self._worker: threading.Thread | None = None
        # A collection that raised (a bug, not a bad file): for the collector's health entry.
        self.failure: str | None = None

    def collect_soon(self, ranks: list[tuple[int, int, Mapping[str, str], float | None]], now: float,
                     stuck: set[int] | None = None) -> None:
        """``collect`` on a worker thread, one at a time: a dump under a hung NFS home must
        stall this thread, never the agent's loop (which reads ``latest`` meanwhile).
        ``stuck``: the pids that look stuck, whose worker servers are asked for their trace."""
        if self._worker is not None and self._worker.is_alive():
            return
        self._stuck = set(stuck or ())
        self._worker = threading.Thread(target=self._collect_noting, args=(list(ranks), now),
                                        name="flight-recorder", daemon=True)
        self._worker.start()

    def wait(self, timeout: float) -> None:
        """Until the collection under way is done (``--once``), at most ``timeout``."""
        if self._worker is not None:
            self._worker.join(timeout)

    def _collect_noting(self, ranks, now: float) -> None:
        try:
            self.collect(ranks, now)
            self.failure = None
        except Exception as e:  # noqa: BLE001 -- reported as the collector's health, never fatal
            logging.getLogger("hangwatch.agent").exception("reading Flight Recorder dumps failed")
            self.failure = f"{type(e).__name__}: {e}"[:200]

    def collect(self, ranks: list[tuple[int, int, Mapping[str, str], float | None]], now: float) -> None:
        """Look at the dumps that are due; ``ranks``: (pid, rank, allowlisted env, started_at)."""
        spent_from = self._monotonic()
        for pid, rank, env, started_at in ranks:
            if self._monotonic() - spent_from > self.budget_s:
                return  # the others are looked at next tick
            state = self._ranks.get(pid)
            if state is None:
                state = self._ranks[pid] = _RankDump(dump_paths(env, rank, self._home_env(pid, env)))
            if pid in self._stuck and self.live is not None:
                self._ask_live(pid, state, now)
            if not state.paths or (state.checked_at is not None and now - state.checked_at < self.every_s):
                continue
            state.checked_at = now
            self._look(pid, state, started_at, now)

    def _ask_live(self, pid: int, state: _RankDump, now: float) -> None:
        if state.live_at is not None and now - state.live_at < LIVE_EVERY_S:
            return
        state.live_at = now
        server = self.live(pid) if self.live is not None else None
        if server is None:
            return
        try:
            report = server.flight_recorder(now)
        except Exception as e:  # noqa: BLE001 -- StackError from the server; the file dump still counts
            logging.getLogger("hangwatch.agent").debug("live Flight Recorder of pid %d: %s", pid, e)
            return
        # A dump file written since (NCCL's watchdog on a timeout) is read by _look as before.
        state.report = report

    def latest(self, pid: int) -> dict | None:
        state = self._ranks.get(pid)
        return state.report if state else None

    def forget(self, pid: int) -> None:
        self._ranks.pop(pid, None)

    def _home_env(self, pid: int, env: Mapping[str, str]) -> dict[str, str]:
        if any(env.get(n) for n in PREFIX_VARS):
            return {}
        try:  # read once per rank, only for torch's default place (HOME is not reported)
            full = read_environ(self.proc_root, pid)
        except OSError:
            return {}
        return {k: full[k] for k in ("HOME", "XDG_CACHE_HOME") if full.get(k)}

    def _look(self, pid: int, state: _RankDump, started_at: float | None, now: float) -> None:
        found = self._newest(pid, state.paths)
        if found is None:
            return
        where, path, st = found
        if started_at is not None and st.st_mtime < started_at - CLOCK_SLACK_S:
            return  # left by an earlier run of this rank
        key = (path, st.st_mtime_ns, st.st_size)
        if key == state.key:
            return
        base = {"path": path[:1024], "dumped_at": st.st_mtime, "size": st.st_size}
        if st.st_size > self.max_bytes:
            state.key = key
            state.report = {**base, "status": f"too big: {st.st_size} bytes (limit {self.max_bytes})",
                            "version": "", "groups": []}
            return
        try:
            data = read_owned_file(where, st, self.max_bytes + 1)
        except OSError as e:
            state.report = {**base, "status": f"unreadable: {e.strerror or 'error'}"[:256], "version": "", "groups": []}
            return
        try:
            if len(data) > self.max_bytes:
                raise ValueError(f"grew past the limit of {self.max_bytes} bytes while read")
            parsed = parse_dump(data)
        except ValueError as e:
            if now - st.st_mtime < SETTLE_S:
                return  # maybe half written: the next look decides
            state.key = key
            state.report = {**base, "status": f"unreadable: {e}"[:256], "version": "", "groups": []}
            return
        state.key = key
        state.report = {**base, "status": "ok", **parsed}

    def _newest(self, pid: int, paths: tuple[str, ...]) -> tuple[str, str, os.stat_result] | None:
        """(where to open it, the rank's path, its stat) of the newest dump there is: a
        regular file owned by the rank's user (or root), so a job cannot point the agent at
        another user's files."""
        owner = self._owner(pid)
        best = None
        for path in paths:
            for where in locations(self.proc_root, pid, path):
                try:
                    st = os.stat(where)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    break  # a FIFO would block the loop on open; a directory is no dump
                if owner is not None and st.st_uid not in (owner, 0):
                    break
                if best is None or st.st_mtime_ns > best[2].st_mtime_ns:
                    best = (where, path, st)
                break
        return best

    def _owner(self, pid: int) -> int | None:
        """The rank's user (the owner of /proc/PID); None once it has exited."""
        try:
            return os.stat(f"{self.proc_root}/{pid}").st_uid
        except OSError:
            return None


def read_owned_file(where: str, expected: os.stat_result, limit: int) -> bytes:
    """Up to ``limit`` bytes of the file ``expected`` describes. Opened without following a
    last symlink and without blocking, then checked again on the open file: a FIFO or another
    file swapped in since the stat raises OSError instead of hanging or being read."""
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
            raise OSError(0, "changed while opened")
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
