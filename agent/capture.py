"""An evidence capture of this node's ranks of one job, when the monitor asks for one
(monitor/engine/capture_requests.py): the moment a verdict held, before a watchdog ends the job.

Per rank, in parallel (a small pool: py-spy pauses each rank for its dump): a native py-spy dump
(or, where py-spy cannot attach, the rank's torch worker server's traceback), its Flight Recorder
(the latest dump file, or the live trace from its worker server), the tail of its stdout/stderr
log; for the node, NCCL's RAS answer. One part, gzipped JSON, uploaded to the monitor, which
streams it to disk. Anything that fails is said in the part (``errors``), never fatal.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import stat as stat_module
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 64 * 1024
WORKERS = 4
# An order is carried out at most once, and at most this many run at a time on a node.
MAX_RUNNING = 2


def tail(path: str, limit: int = LOG_TAIL_BYTES, follow: bool = True) -> str:
    """The last ``limit`` bytes of a regular file, from a line start where one is in reach.
    ``follow=False``: a symlink at ``path`` is refused (a log known by name may have been swapped
    for a link to a file the agent, often root, must not upload)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat_module.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        size = st.st_size
        f.seek(max(0, size - limit))
        data = f.read(limit)
    if size > limit and b"\n" in data:
        data = data[data.index(b"\n") + 1:]
    return data.decode("utf-8", "replace")


def log_tails(proc_root: str, pid: int, known_paths: list[str]) -> dict[str, str]:
    """The rank's stdout and stderr, if files (read through /proc while it lives), else the files
    its log follower last knew; path -> tail."""
    out: dict[str, str] = {}
    seen: set[tuple[int, int]] = set()
    candidates: list[tuple[str, str, bool]] = []  # (shown, where to open, follow a symlink)
    for fd in (1, 2):
        link = f"{proc_root}/{pid}/fd/{fd}"
        try:
            candidates.append((os.readlink(link), link, True))  # the magic link: the open file itself
        except OSError:
            continue
    candidates += [(p, p, False) for p in known_paths]
    for shown, where, follow in candidates:
        try:
            st = os.stat(where, follow_symlinks=follow)
            if not stat_module.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out[shown] = tail(where, follow=follow)
        except OSError:
            continue
    return out


class Capturer:
    """Carries out capture orders; ``rank_of(pid)`` gives a tracked rank's facts, ``take_stack``,
    ``flight_recorder`` and ``nccl_ras`` the agent's collectors, ``upload(path, gzipped body)``
    sends the part to the monitor that asked."""

    def __init__(self, proc_root: str, rank_of: Callable[[int], dict | None],
                 take_stack: Callable[[int], dict], flight_recorder: Callable[[int], dict | None],
                 log_paths: Callable[[int], list[str]], nccl_ras: Callable[[], dict | None], node: str) -> None:
        self.proc_root, self.rank_of, self.take_stack = proc_root, rank_of, take_stack
        self.flight_recorder, self.log_paths, self.nccl_ras, self.node = flight_recorder, log_paths, nccl_ras, node
        self._seen: set[str] = set()
        self._running = 0
        self._lock = threading.Lock()
        self.done = 0

    def take(self, order: dict, upload: Callable[[str, bytes], str | None]) -> None:
        """Start the capture an order asks for, on a thread of its own (from the sending thread)."""
        spec = order.get("capture")
        if not isinstance(spec, dict) or not isinstance(spec.get("upload"), str) or not isinstance(spec.get("pids"), list):
            return
        with self._lock:
            if order["id"] in self._seen or self._running >= MAX_RUNNING:
                return
            self._seen.add(order["id"])
            self._running += 1
        threading.Thread(target=self._run, args=(spec, upload), name="capture", daemon=True).start()

    def _run(self, spec: dict, upload: Callable[[str, bytes], str | None]) -> None:
        try:
            started = time.monotonic()
            part = self.capture(spec)
            body = gzip.compress(json.dumps(part).encode(), compresslevel=5)
            failed = upload(spec["upload"], body)
            if failed:
                log.error("capture %s: upload failed: %s", spec.get("bundle"), failed)
            else:
                log.info("capture %s: %d ranks, %d bytes, in %.1fs", spec.get("bundle"), len(part["ranks"]),
                         len(body), time.monotonic() - started)
                self.done += 1
        except Exception:  # noqa: BLE001 -- a capture must never take the agent down
            log.exception("capture %s failed", spec.get("bundle"))
        finally:
            with self._lock:
                self._running -= 1

    def capture(self, spec: dict) -> dict[str, Any]:
        """The part for this node (also what --once style tests read)."""
        pids = [p for p in spec["pids"] if isinstance(p, int) and not isinstance(p, bool)][:4096]
        taken_at = time.time()
        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="capture") as pool:
            ranks = list(pool.map(self._rank_part, pids))
        return {"bundle": spec.get("bundle"), "job_id": spec.get("job_id"), "node": self.node,
                "taken_at": taken_at, "duration_s": round(time.time() - taken_at, 3),
                "ranks": [r for r in ranks if r is not None], "nccl_ras": self.nccl_ras()}

    def _rank_part(self, pid: int) -> dict | None:
        facts = self.rank_of(pid)
        if facts is None:
            return None  # not a rank this agent tracks: never dumped
        part: dict[str, Any] = {**facts, "errors": {}}
        if facts.get("alive"):
            try:
                part["stack"] = self.take_stack(pid)
            except Exception as e:  # noqa: BLE001 -- StackError, OSError: said in the part
                part["errors"]["stack"] = str(e)[:512]
        part["flight_recorder"] = self.flight_recorder(pid)
        try:
            part["logs"] = log_tails(self.proc_root, pid, self.log_paths(pid))
        except Exception as e:  # noqa: BLE001
            part["errors"]["logs"] = str(e)[:512]
        return part
