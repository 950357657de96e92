"""hangwatch_common/sdnotify.py against a real AF_UNIX datagram socket, as systemd's NOTIFY_SOCKET would be."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangwatch_common.sdnotify import Notifier, watchdog_interval


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """(NOTIFY_SOCKET value, the receiving socket): a file path, or an ``@`` abstract name."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        name = str(tmp_path / "notify")
        sock.bind(name)
    else:
        name = f"@hangwatch-test-{os.getpid()}-{id(sock)}"
        sock.bind("\0" + name[1:])
    sock.settimeout(2.0)
    try:
        yield name, sock
    finally:
        sock.close()


def received(sock: socket.socket) -> list[list[str]]:
    out = []
    sock.settimeout(0.2)
    try:
        while True:
            out.append(sock.recv(4096).decode().split("\n"))
    except (TimeoutError, socket.timeout):
        return out


def test_ready_and_status(notify_socket: tuple[str, socket.socket]) -> None:
    name, sock = notify_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": name})
    assert n.enabled
    assert n.ready("watching 2 ranks")
    assert sock.recv(4096).decode().split("\n") == ["READY=1", f"MAINPID={os.getpid()}", "STATUS=watching 2 ranks"]
    assert n.status("3 jobs, 1 hung")
    assert sock.recv(4096).decode() == "STATUS=3 jobs, 1 hung"
    assert n.stopping("bye")
    assert sock.recv(4096).decode().split("\n") == ["STOPPING=1", "STATUS=bye"]
    n.close()


def test_watchdog_cadence_is_half_of_watchdog_usec(notify_socket: tuple[str, socket.socket]) -> None:
    name, sock = notify_socket
    clock = FakeClock()
    n = Notifier.from_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())},
                          clock=clock)
    assert n.watchdog_s == 10.0
    n.ready()
    sock.recv(4096)
    sent_at = []
    for _ in range(61):  # a main loop ticking every 0.5 s for 30 s
        if n.tick():
            sent_at.append(clock.now)
        clock.now += 0.5
    assert sent_at == [1010.0, 1020.0, 1030.0]
    assert received(sock) == [["WATCHDOG=1"]] * 3
    n.close()


def test_first_tick_without_ready_pings_at_once(notify_socket: tuple[str, socket.socket]) -> None:
    name, sock = notify_socket
    n = Notifier.from_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "1000000"}, clock=FakeClock())
    assert n.tick() and not n.tick()
    assert received(sock) == [["WATCHDOG=1"]]
    n.close()


def test_no_op_without_notify_socket(tmp_path: Path) -> None:
    n = Notifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not n.enabled and n.watchdog_s is None
    assert not n.ready("x") and not n.tick() and not n.status("x") and not n.stopping()
    assert n._sock is None  # not even a socket was opened
    assert not Notifier.from_env({"NOTIFY_SOCKET": ""}).enabled


def test_gone_socket_never_raises(tmp_path: Path) -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "missing"), "WATCHDOG_USEC": "2"}, clock=FakeClock())
    assert n.enabled
    assert not n.ready() and not n.status("x")
    n.close()


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "junk"}, None),
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
])
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(env) == expected
