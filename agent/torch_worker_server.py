"""torch's own debug handlers, read over a rank's worker server: Python stacks without ptrace and
the live Flight Recorder trace.

A rank wrapped in ``torch.distributed.elastic.control_plane.worker_main`` (or running
``torch.distributed.debug``'s worker server on a unix socket) answers HTTP on a unix socket:
``POST /handler/dump_traceback`` (faulthandler's text of every thread), ``/handler/fr_trace_json``
(its Flight Recorder entries and per-group sequence counters, on gloo and NCCL alike) and more
(``GET /handler/`` lists them). Where py-spy cannot attach (no CAP_SYS_PTRACE, a cluster that
forbids it) the stacks come from here; the Flight Recorder trace is read live while a rank looks
stuck, so the monitor can name the collective (and its sequence number) a rank never entered.

The socket is found without the job's help: TORCH_WORKER_SERVER_SOCKET in the rank's environment
when it was set before the rank started, else any unix socket the rank listens on that answers
as a torch WorkerServer (a script that sets the variable itself, per rank, is found this way).
It is reached through /proc/PID/root, so a rank in a container is reached in its own file system.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from agent.flight_recorder_dump import parse_dump
from agent.sockets import socket_inodes
from agent.stacks import MAX_FRAMES, MAX_THREADS, StackError

ENV_VAR = "TORCH_WORKER_SERVER_SOCKET"
# A rank starts its server when its code reaches worker_main: one not found is looked for again.
LOOK_AGAIN_S = 10.0
TIMEOUT_S = 5.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024
BANNER = "torch.distributed.WorkerServer"
# /proc/net/unix: Num RefCount Protocol Flags Type St Inode Path; a listening socket has
# __SO_ACCEPTCON (0x10000) in Flags.
_ACCEPTING = 0x10000
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


def listening_unix_sockets(net_unix: str, inodes: Iterable[int]) -> list[str]:
    """Paths of the listening unix sockets among ``inodes`` (the rank's fds), from /proc/PID/net/unix (pure)."""
    wanted = set(inodes)
    found = []
    for line in net_unix.splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) < 8 or not parts[7].startswith("/"):
            continue  # unnamed or abstract sockets: nothing to connect to by path
        try:
            flags, inode = int(parts[3], 16), int(parts[6])
        except ValueError:
            continue
        if flags & _ACCEPTING and inode in wanted:
            found.append(parts[7].strip())
    return found


def parse_traceback(text: str, max_threads: int = MAX_THREADS, max_frames: int = MAX_FRAMES) -> list[dict]:
    """ThreadStackReport dicts from faulthandler's text (frames innermost first, as py-spy's), the
    main thread first (pure). Threads without a Python frame (the one that answered) are left out;
    the one whose outermost frame is ``<module>`` is the main thread."""
    threads: list[dict] = []
    current: dict | None = None
    for line in text.splitlines():
        head = _THREAD.match(line.strip())
        if head:
            current = {"tid": None, "name": "", "active": None, "owns_gil": None, "frames": []}
            threads.append(current)
            continue
        frame = _FRAME.match(line)
        if frame and current is not None and len(current["frames"]) < max_frames:
            current["frames"].append({"name": frame.group(3)[:256], "file": frame.group(1)[:1024],
                                      "line": int(frame.group(2)), "native": False})
    kept = [t for t in threads if t["frames"]]  # the answering thread is torch's, with none
    for t in kept:
        if t["frames"][-1]["name"] == "<module>":
            t["name"] = "MainThread"
    kept.sort(key=lambda t: t["name"] != "MainThread")
    if not kept and text.strip():
        raise StackError("the worker server's traceback has no Python frame")
    return kept[:max_threads]


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (the standard library's client, the socket closed on every path)."""

    def __init__(self, where: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.where = where

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.where)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _exchange(where: str, method: str, path: str, timeout: float) -> tuple[int, bytes]:
    conn = _UnixConnection(where, timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read(MAX_ANSWER_BYTES + 1)
    finally:
        conn.close()


class WorkerServer:
    """One rank's worker server: its socket, reached through the rank's root."""

    def __init__(self, proc_root: str, pid: int, path: str) -> None:
        self.pid, self.path = pid, path
        self.where = f"{proc_root}/{pid}/root{path}"

    def call(self, handler: str, timeout: float = TIMEOUT_S) -> bytes:
        """POST one handler; its answer's bytes. Raises StackError saying why not."""
        try:
            status, body = _exchange(self.where, "POST", f"/handler/{handler}", timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise StackError(f"torch worker server {self.path}: {type(exc).__name__}: {exc}"[:512]) from None
        if status != 200:
            text = body[:200].decode("utf-8", "replace").strip()
            raise StackError(f"torch worker server {self.path}: {handler} answered HTTP {status}: {text}")
        if len(body) > MAX_ANSWER_BYTES:
            raise StackError(f"torch worker server {self.path}: {handler} answer over {MAX_ANSWER_BYTES} bytes")
        return body

    def is_torch(self, timeout: float = 1.0) -> bool:
        """Whether the socket answers as torch's WorkerServer (a GET of its index page)."""
        try:
            status, body = _exchange(self.where, "GET", "/", timeout)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and BANNER in body[:512].decode("utf-8", "replace")

    def stack(self, clock=time.time) -> dict:
        """A StackReport dict from ``dump_traceback`` (no ptrace, no pause of the rank)."""
        taken_at, started = clock(), time.monotonic()
        text = self.call("dump_traceback").decode("utf-8", "replace")
        return {"taken_at": taken_at, "native": False, "duration_s": round(time.monotonic() - started, 3),
                "threads": parse_traceback(text)}

    def flight_recorder(self, now: float) -> dict:
        """A FlightRecorderReport dict from the live ``fr_trace_json``."""
        data = self.call("fr_trace_json")
        base = {"path": f"torch worker server {self.path}"[:1024], "dumped_at": now, "size": len(data)}
        try:
            return {**base, "status": "ok", **parse_dump(data)}
        except ValueError as exc:
            return {**base, "status": f"unreadable: {exc}"[:256], "version": "", "groups": []}


def find_server(proc_root: str, pid: int, env: Mapping[str, str], socket_inodes: Iterable[int]) -> WorkerServer | None:
    """The rank's worker server: the variable's socket, else a listening unix socket that answers as one."""
    named = env.get(ENV_VAR, "").strip()
    if named.startswith("/"):
        return WorkerServer(proc_root, pid, named)
    try:
        with open(f"{proc_root}/{pid}/net/unix", encoding="utf-8", errors="replace") as f:
            net_unix = f.read()
    except OSError:
        return None
    for path in listening_unix_sockets(net_unix, socket_inodes):
        server = WorkerServer(proc_root, pid, path)
        if server.is_torch():
            return server
    return None


class WorkerServerFinder:
    """Each rank's worker server, looked for on the threads that use it (never the agent's loop)
    and kept; a rank without one is looked at again every LOOK_AGAIN_S."""

    def __init__(self, proc_root: str, env_of: Callable[[int], Mapping[str, str] | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root, self.env_of, self.clock = proc_root, env_of, clock
        self._found: dict[int, tuple[WorkerServer | None, float]] = {}
        self._lock = threading.Lock()

    def __call__(self, pid: int) -> WorkerServer | None:
        with self._lock:
            known = self._found.get(pid)
        if known is not None and (known[0] is not None or self.clock() - known[1] < LOOK_AGAIN_S):
            return known[0]
        env = self.env_of(pid)
        server = None
        if env is not None:
            try:
                server = find_server(self.proc_root, pid, env, socket_inodes(self.proc_root, pid))
            except OSError:
                server = None  # the rank ended, or its fds are not ours to read
        with self._lock:
            self._found[pid] = (server, self.clock())
        return server

    def forget(self, pid: int) -> None:
        with self._lock:
            self._found.pop(pid, None)
