"""torch's worker server as the agent reads it (agent/torch_worker_server.py): the parsers on text,
and real processes serving torch's handlers on a unix socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sockets import socket_inodes
from agent.stacks import StackSampler
from agent.torch_worker_server import (WorkerServer, WorkerServerFinder, find_server, listening_unix_sockets,
                                       parse_traceback)

pytestmark = pytest.mark.live

TRACEBACK = """Current thread 0x00007f4a72ffd6c0 (most recent call first):
  <no Python frame>

Thread 0x00007f4a11111111 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f4a9b5feb80 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/train.py", line 13 in main
  File "/work/train.py", line 15 in <module>
"""


def test_faulthandler_text_becomes_threads_main_first_innermost_frame_first() -> None:
    threads = parse_traceback(TRACEBACK)
    assert [t["name"] for t in threads] == ["MainThread", ""]
    main = threads[0]["frames"]
    assert [(f["name"], f["line"]) for f in main] == [("all_reduce", 3252), ("wrapper", 83), ("main", 13),
                                                       ("<module>", 15)]
    assert main[0]["file"].endswith("distributed_c10d.py") and not main[0]["native"]


def test_frames_are_capped() -> None:
    deep = "Thread 0x1 (most recent call first):\n" + "".join(
        f'  File "/a.py", line {i} in f{i}\n' for i in range(100))
    assert len(parse_traceback(deep, max_frames=64)[0]["frames"]) == 64


NET_UNIX = """Num       RefCount Protocol Flags    Type St Inode Path
0000000057fdda37: 00000002 00000000 00010000 0001 01 2057732 /tmp/frg-1.sock
000000008a31d6ac: 00000002 00000000 00010000 0001 01 2056598 /tmp/frg-0.sock
00000000aaaaaaaa: 00000003 00000000 00000000 0001 03 2056599 /tmp/frg-0.sock
00000000bbbbbbbb: 00000002 00000000 00010000 0001 01 2056600 @abstract
"""


@pytest.mark.parametrize(("inodes", "expected"), [
    ({2056598}, ["/tmp/frg-0.sock"]),
    ({2056599}, []),  # connected, not listening
    ({2056600}, []),  # abstract: no path to connect by
    ({2057732, 2056598}, ["/tmp/frg-1.sock", "/tmp/frg-0.sock"]),
    (set(), []),
])
def test_a_ranks_listening_unix_sockets(inodes: set[int], expected: list[str]) -> None:
    assert listening_unix_sockets(NET_UNIX, inodes) == expected


SERVING = """
import os, sys, time
if len(sys.argv) > 1:
    os.environ["TORCH_WORKER_SERVER_SOCKET"] = sys.argv[1]  # set after start: found by what it listens on
from torch.distributed.elastic.control_plane import worker_main

def park_here():
    print("serving", flush=True)
    time.sleep(120)

with worker_main():
    park_here()
"""


@pytest.fixture
def serving(tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen] = []

    def start(socket: Path, in_env: bool) -> subprocess.Popen:
        env = dict(os.environ, TORCH_WORKER_SERVER_SOCKET=str(socket)) if in_env else dict(os.environ)
        argv = [sys.executable, "-c", SERVING] + ([] if in_env else [str(socket)])
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
        deadline = time.monotonic() + 30
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("in_env", [True, False], ids=["named-in-its-environment", "found-by-its-socket"])
def test_a_real_worker_server_gives_stacks_and_the_flight_recorder(serving, tmp_path: Path, in_env: bool) -> None:
    socket = tmp_path / "rank0.sock"
    proc = serving(socket, in_env)
    env = {"TORCH_WORKER_SERVER_SOCKET": str(socket)} if in_env else {}
    server = find_server("/proc", proc.pid, env, socket_inodes("/proc", proc.pid))
    assert server is not None and server.path == str(socket)
    stack = server.stack()
    main = stack["threads"][0]
    assert main["name"] == "MainThread" and main["frames"][0]["name"] == "park_here", main
    record = server.flight_recorder(time.time())
    assert record["status"] == "ok" and record["path"] == f"torch worker server {socket}", record


def test_a_process_without_a_server_has_none(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        assert find_server("/proc", proc.pid, {}, socket_inodes("/proc", proc.pid)) is None
        gone = WorkerServer("/proc", proc.pid, str(tmp_path / "none.sock"))
        with pytest.raises(Exception, match="torch worker server"):
            gone.stack()
    finally:
        proc.kill()
        proc.wait()


def test_without_py_spy_the_sampler_takes_the_stack_from_the_worker_server(serving, tmp_path: Path) -> None:
    socket = tmp_path / "rank1.sock"
    proc = serving(socket, True)
    finder = WorkerServerFinder("/proc", lambda pid: {"TORCH_WORKER_SERVER_SOCKET": str(socket)})
    sampler = StackSampler(None, worker_server=finder)
    try:
        assert sampler.status != "ok"
        sampler.dump_now(proc.pid)
        stack, error = sampler.latest(proc.pid)
        assert error is None and stack is not None, error
        assert stack["threads"][0]["frames"][0]["name"] == "park_here"
    finally:
        sampler.close()
