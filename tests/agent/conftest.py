"""Real processes for the agent's live tests, always cleaned up by PID."""

from __future__ import annotations

import json
from collections.abc import Callable
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hangwatch.demo.harness import free_port

# A stand-in for a training rank: prints "step N" lines; busy or sleeping; may fork a
# helper that inherits the environment (like a DataLoader worker); may exit with a code, after
# EXIT_AFTER seconds or once the file EXIT_WHEN exists (a test's cue, where timing must not decide).
RANK_SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    mode = sys.argv[1]
    if mode == "with-child":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child {child.pid}", flush=True)
    step = 0
    deadline = time.time() + float(os.environ.get("EXIT_AFTER", "600"))
    exit_when = os.environ.get("EXIT_WHEN")
    while time.time() < deadline and not (exit_when and os.path.exists(exit_when)):
        step += 1
        print(f"step {step}", flush=True)
        if mode == "busy":
            end = time.time() + 0.1
            while time.time() < end:
                sum(i * i for i in range(1000))
        else:
            time.sleep(0.1)
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
    """
)


class Ranks:
    """Starts fake ranks of one job; kills exactly the PIDs it started (and their children)."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        # The worker's own block (a random port could be one the kernel hands out for an outgoing
        # connection: torchrun's store then failed with EADDRINUSE).
        self.port = free_port()
        self.job = f"127.0.0.1:{self.port}"
        self.script = tmp_path / "rank.py"
        self.script.write_text(RANK_SCRIPT)
        self.procs: list[subprocess.Popen] = []
        self.extra_pids: list[int] = []

    def start(self, rank: int, mode: str = "sleep", world_size: int = 2, **env) -> subprocess.Popen:
        log = open(self.tmp / f"rank{rank}.log", "w")
        full_env = {
            "PATH": os.environ.get("PATH", ""),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port),
            **{k: str(v) for k, v in env.items()},
        }
        proc = subprocess.Popen(
            [sys.executable, str(self.script), mode], env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.procs.append(proc)
        return proc

    def log_path(self, rank: int) -> Path:
        return self.tmp / f"rank{rank}.log"

    def wait_for_line(self, rank: int, prefix: str, timeout: float = 10.0) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in self.log_path(rank).read_text().splitlines():
                if line.startswith(prefix):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"rank {rank} printed no {prefix!r} line")

    def cleanup(self) -> None:
        for pid in self.extra_pids:
            _kill(pid)
        for proc in self.procs:
            if proc.poll() is None:
                _kill(proc.pid)
            proc.wait(timeout=10)


def _kill(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # not our child (a grandchild): init reaps it


def children_of(parent: int) -> list[int]:
    """The pids whose parent is ``parent``, read from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                    out.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.fixture
def ranks(tmp_path):
    r = Ranks(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


def agent_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent.cli", *args]


def run_agent_once(*args: str, timeout: float = 30) -> dict:
    done = subprocess.run(agent_argv("--once", *args), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class Receiver:
    """A tiny monitor stand-in on 127.0.0.1: stores every report it gets, answers what it is told
    (``status``, extra ``headers``, the JSON ``answer``)."""

    def __init__(self, status: int = 200):
        self.reports: list[dict] = []
        self.status = status
        self.headers: dict[str, str] = {}
        self.answer: dict = {}
        # A post ``hold`` accepts is answered only once ``released`` is set (a slow or hung monitor),
        # so a test can act while the sender waits for that answer.
        self.hold: Callable[[dict], bool] | None = None
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/api/v1/reports":
                    report = json.loads(body)
                    outer.reports.append(report)
                    if outer.hold is not None and outer.hold(report):
                        outer.released.wait(timeout=10)
                payload = json.dumps(outer.answer).encode()
                self.send_response(outer.status)
                for name, value in outer.headers.items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll keeps shutdown() quick.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def wait_for(self, predicate, timeout: float = 15.0, describe=None) -> dict:
        """The newest report ``predicate`` accepts; on timeout, ``describe(last report)`` says what it held."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for report in reversed(list(self.reports)):
                if predicate(report):
                    return report
            time.sleep(0.05)
        last = self.reports[-1] if self.reports else None
        shown = f"; the last: {describe(last)}" if describe is not None and last is not None else ""
        raise AssertionError(f"no matching report in {len(self.reports)} received{shown}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def receiver():
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def agent_process():
    """Starts the agent loop as a subprocess; stops it by PID at the end."""
    started: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(agent_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)
