"""Idle, slow and flooding clients against the real monitor under a small open-file limit."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
from monitor_reports import rank, report
from real_monitor import metric, running_monitor

from monitor.web.log_limit import RepeatLimitFilter

OPEN_FILE_LIMIT = 256
IDLE_CONNECTIONS = 400  # more than the monitor may open at all


def _idle_connections(port: int, count: int, stack: ExitStack) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        s = stack.enter_context(socket.socket())
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        opened.append(s)
    return opened


def _until(check, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _post_accepted(base: str, job_id: str) -> bool:
    try:
        return httpx.post(f"{base}/api/v1/reports", json=report(ranks=[rank(job_id=job_id)]), timeout=3).status_code == 202
    except httpx.TransportError:
        return False


def test_more_idle_connections_than_file_descriptors_do_not_shut_agents_out(tmp_path: Path) -> None:
    env = {"HANGWATCH_HEADER_TIMEOUT_S": "3"}
    with running_monitor(tmp_path, open_file_limit=OPEN_FILE_LIMIT, extra_env=env) as monitor, ExitStack() as stack:
        port = int(monitor.base.rsplit(":", 1)[1])
        idle = _idle_connections(port, IDLE_CONNECTIONS, stack)
        # An agent still gets in while the squatters hold their sockets: the oldest idle ones make room.
        _until(lambda: _post_accepted(monitor.base, "job-agent"), 10, "an agent's report was never accepted")
        assert metric(monitor.base, "hangwatch_monitor_connections_closed_total", reason="evicted_idle") > 0
        assert metric(monitor.base, "hangwatch_monitor_connections") < OPEN_FILE_LIMIT
        # The squatters that are left are closed once they have sent no request for the header timeout.
        _until(lambda: metric(monitor.base, "hangwatch_monitor_connections") <= 2, 15,
               "idle connections were never closed")
        assert metric(monitor.base, "hangwatch_monitor_connections_closed_total", reason="header_timeout") > 0
        closed = sum(1 for s in idle if s.recv(1) == b"")
        assert closed == IDLE_CONNECTIONS
        assert monitor.proc.poll() is None
    assert monitor.log.stat().st_size < 100_000, monitor.log_text()[-2000:]


def test_a_client_sending_its_headers_a_byte_at_a_time_is_cut_off(tmp_path: Path) -> None:
    with running_monitor(tmp_path, extra_env={"HANGWATCH_HEADER_TIMEOUT_S": "2"}) as monitor:
        port = int(monitor.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            started = time.monotonic()
            cut_off = False
            for byte in b"GET /diagnose HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    cut_off = True
                    break
                time.sleep(0.3)
                if time.monotonic() - started > 15:
                    break
            if not cut_off:
                slow.settimeout(5)
                try:
                    cut_off = slow.recv(1) == b""
                except ConnectionResetError:
                    cut_off = True
            assert cut_off, "a trickling client kept its connection"
        assert metric(monitor.base, "hangwatch_monitor_connections_closed_total", reason="header_timeout") >= 1
        assert _post_accepted(monitor.base, "job-after")


def _records(logger: str, message: str, count: int) -> Iterator[logging.LogRecord]:
    for _ in range(count):
        yield logging.LogRecord(logger, logging.ERROR, __file__, 1, message, None, None)


def test_repeated_log_lines_are_dropped_past_the_burst_and_counted() -> None:
    now = [0.0]
    limiter = RepeatLimitFilter(burst=3, window_s=60, clock=lambda: now[0])
    passed = [limiter.filter(r) for r in _records("asyncio", "socket.accept() out of system resource", 100)]
    assert passed.count(True) == 3
    assert limiter.filter(next(_records("asyncio", "another message", 1)))
    now[0] = 61.0
    [record] = _records("asyncio", "socket.accept() out of system resource", 1)
    assert limiter.filter(record)
    assert "97 more like this dropped" in record.getMessage()


def _answer(port: int, head: bytes, chunk: int = 4096) -> bytes:
    """Send ``head`` in chunks (stopping when the monitor closes), then read what comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            for i in range(0, len(head), chunk):
                s.sendall(head[i:i + chunk])
        except OSError:
            pass  # closed on us mid-way: the answer is already sent
        got = b""
        try:
            while piece := s.recv(65536):
                got += piece
        except (ConnectionResetError, TimeoutError):
            pass
        return got


def test_request_heads_past_the_limits_get_431_and_the_monitor_goes_on(tmp_path: Path) -> None:
    """httptools bounds no header: a header too large (whole, or still arriving), too many
    headers: each answered 431 and its connection closed; normal requests are served throughout."""
    with running_monitor(tmp_path, extra_env={"HANGWATCH_MAX_HEADER_BYTES": "8192"}) as monitor:
        port = int(monitor.base.rsplit(":", 1)[1])
        large = b"GET /diagnose HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
        many = b"GET /diagnose HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n"
        endless = b"GET /diagnose HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200_000  # never finishes
        for head in (large, many, endless):
            got = _answer(port, head)
            assert got.startswith(b"HTTP/1.1 431 "), got[:200]
        assert _answer(port, b"GET /diagnose HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert metric(monitor.base, "hangwatch_monitor_connections_closed_total", reason="header_too_large") == 3
        assert _post_accepted(monitor.base, "job-after")
