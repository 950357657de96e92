"""The file a stuck rank's main thread is blocked on (agent/blocked_io.py): the parser on /proc lines,
then real processes blocked in an open and in a write."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from agent.blocked_io import parse_syscall, read_blocked_io

AT_FDCWD = "0xffffffffffffff9c"


@pytest.mark.parametrize(
    "line, machine, expect",
    [
        # openat(AT_FDCWD, path, ...): the path is read from the address
        (f"257 {AT_FDCWD} 0x7ffd1234 0x80241 0x1b6 0x0 0x0 0x7ffd0000 0x7f000000", "x86_64",
         ("openat", None, 0x7FFD1234)),
        ("1 0x5 0x7f00aa 0x10000 0x0 0x0 0x0 0x7ffd0000 0x7f000000", "x86_64", ("write", 5, None)),
        ("74 0x9 0x0 0x0 0x0 0x0 0x0 0x7ffd0000 0x7f000000", "x86_64", ("fsync", 9, None)),
        ("56 0xffffff9c 0xffffc000 0x241 0x1b6 0x0 0x0 0xffff0000 0xffff1000", "aarch64", ("openat", None, 0xFFFFC000)),
        ("82 0x7 0x0 0x0 0x0 0x0 0x0 0xffff0000 0xffff1000", "aarch64", ("fsync", 7, None)),
        # not a file: a collective's futex wait, a sleep, epoll, or a running thread
        ("202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x7ffd0000 0x7f000000", "x86_64", None),
        ("230 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x7ffd0000 0x7f000000", "x86_64", None),
        ("running", "x86_64", None),
        ("-1 0x7ffd0000 0x7f000000", "x86_64", None),
        # a machine whose numbers are not known names nothing rather than the wrong call
        ("1 0x5 0x7f00aa 0x10000 0x0 0x0 0x0 0x7ffd0000 0x7f000000", "riscv64", None),
        ("", "x86_64", None),
        ("1 0xzz", "x86_64", None),
    ],
)
def test_parse_syscall(line, machine, expect):
    got = parse_syscall(line, machine)
    assert (None if got is None else (got.syscall, got.fd, got.path_address)) == expect


def test_a_negative_fd_is_no_file():
    got = parse_syscall(f"1 {AT_FDCWD} 0x0 0x0 0x0 0x0 0x0 0x0 0x0", "x86_64")
    assert got is not None and got.fd is None


def test_a_process_that_is_gone_names_nothing(tmp_path):
    assert read_blocked_io(str(tmp_path), 12345) is None


def _wait_blocked(pid: int, syscall: str, deadline_s: float = 10.0) -> dict:
    deadline = time.monotonic() + deadline_s
    got = None
    while time.monotonic() < deadline:
        got = read_blocked_io("/proc", pid)
        if got is not None and got["syscall"] == syscall:
            return got
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never seen blocked in {syscall}: last {got}")


@pytest.mark.live
def test_a_real_open_that_never_returns_is_named_with_its_path(tmp_path):
    """open() for writing on a FIFO nobody reads blocks in the kernel, as an open on a hung network
    mount does: there is no fd yet, and the path is read from the process's memory."""
    fifo = tmp_path / "ckpt.pt"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'wb')"])
    try:
        got = _wait_blocked(proc.pid, "openat")
        assert got == {"syscall": "openat", "path": str(fifo), "fd": None}
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.live
def test_a_real_relative_open_is_named_from_the_working_directory(tmp_path):
    os.mkfifo(tmp_path / "relative.pt")
    proc = subprocess.Popen([sys.executable, "-c", "open('relative.pt', 'wb')"], cwd=tmp_path)
    try:
        assert _wait_blocked(proc.pid, "openat")["path"] == str(tmp_path / "relative.pt")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.live
def test_a_real_write_that_never_returns_is_named_by_its_fd(tmp_path):
    """A write into a pipe nobody drains blocks once the pipe is full: the file comes from /proc/PID/fd."""
    fifo = tmp_path / "stream.bin"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # held open, never read
    writer = textwrap.dedent(f"""
        with open({str(fifo)!r}, "wb", buffering=0) as f:
            f.write(b"x" * (1 << 20))
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    try:
        got = _wait_blocked(proc.pid, "write")
        assert got["path"] == str(fifo) and got["fd"] is not None and got["fd"] >= 3, got
    finally:
        proc.kill()
        proc.wait()
        os.close(reader)
