"""Slow, idle and half-open clients cannot exhaust the monitor's connections or file descriptors.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but a connection
that never finishes its request headers is kept forever, and nothing bounds how many are
open: 1,100 idle sockets once took every file descriptor of a monitor under systemd's default
limit of 1,024, shut every agent out, and filled the log with "Too many open files".

``guarded_protocol`` returns uvicorn's httptools protocol with three guards added:

- a request's headers must arrive within ``header_timeout_s`` of its first byte (or of the
  connection, or of the previous response), its body within ``body_timeout_s`` of the headers;
- past ``max_connections`` open connections, the oldest one that is not in the middle of a
  request is closed to make room (an agent's fresh connection wins over an idle squatter);
  when every connection is busy, the new one is closed instead;
- a request's head (request line and headers) may hold at most ``max_header_bytes`` and
  ``max_headers`` headers, else it is answered 431 and the connection closed: httptools has no
  limit of its own and buffers a header by repeated concatenation, so 16 clients each sending
  headers of 100 KB grew the monitor from 60 to 487 MB before the header timeout cut them off;
- each close is counted for ``/metrics`` (``HttpStats``).

``raise_open_file_limit`` lifts the soft RLIMIT_NOFILE to the hard one at start, as systemd
expects of daemons that need many sockets, and the connection cap is kept below it.
"""

from __future__ import annotations

import asyncio
import resource
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hangwatch_common.settings import setting

# File descriptors left for the database, logs, token files and the process's own pipes.
RESERVED_FDS = 64
CLOSE_REASONS = ("header_timeout", "body_timeout", "evicted_idle", "refused_full", "header_too_large")


@dataclass
class HttpStats:
    """What the connection guards and the token checks (monitor/web/auth.py) turned away, for /metrics."""

    open_connections: int = 0
    closed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLOSE_REASONS, 0))
    # Requests refused with 401, by kind: "ingest", "read", "metrics".
    unauthorized: dict[str, int] = field(default_factory=lambda: {"ingest": 0, "read": 0, "metrics": 0, "relay": 0})


class HeadTooLarge(Exception):
    """Raised from a parser callback to stop reading a request head past the limits."""


@dataclass(frozen=True)
class ConnectionLimits:
    """The monitor's and the relay's settings of these names (they inherit them), declared here."""

    max_connections: int = setting(4096, help="open connections at most (kept under the open-file limit)", at_least=1)
    header_timeout_s: float = setting(10.0, help="seconds a client may take over a request's headers", positive=True)
    body_timeout_s: float = setting(30.0, help="seconds a client may take over a request's body", positive=True)
    # An agent's request head is under 1 KB; a browser's with cookies a few KB.
    max_header_bytes: int = setting(32 * 1024, help="largest request head (request line and headers): 431 past it",
                                    at_least=1024)
    max_headers: int = setting(64, help="most headers in a request: 431 past it", at_least=1)


def raise_open_file_limit() -> int:
    """Lift the soft open-file limit to the hard one; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(limits: ConnectionLimits, open_file_limit: int) -> int:
    """The connection cap: the configured one, kept under the open-file limit."""
    return max(1, min(limits.max_connections, open_file_limit - RESERVED_FDS))


def guarded_protocol(limits: ConnectionLimits, cap: int, stats: HttpStats) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with the guards above (one class per server)."""
    # Connections not in the middle of a request, oldest first: the ones eviction may close.
    idle: OrderedDict[GuardedProtocol, None] = OrderedDict()

    class GuardedProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        # The head so far: raw bytes received while it is incomplete (a giant header is refused
        # before it ends), and the size and count of the parts the parser handed over.
        _raw_head_bytes = 0
        _in_head = True
        _head_size = 0
        _head_refused = False

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._raw_head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._raw_head_bytes > limits.max_header_bytes and not self.transport.is_closing():
                self._head_refused = True
                self.send_400_response("")

        def on_message_begin(self) -> None:
            idle.pop(self, None)
            self._head_size, self._head_refused = 0, False
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._count_head(len(url))

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._count_head(len(name) + len(value) + 4)

        def _count_head(self, size: int) -> None:
            self._head_size += size
            if self._head_size > limits.max_header_bytes or len(self.headers or ()) > limits.max_headers:
                self._head_refused = True
                raise HeadTooLarge  # stops the parser; uvicorn answers through send_400_response

        def send_400_response(self, msg: str) -> None:
            if not self._head_refused:
                super().send_400_response(msg)
                return
            stats.closed["header_too_large"] += 1
            self._disarm()
            text = f"request head over {limits.max_header_bytes} bytes or {limits.max_headers} headers".encode()
            self.transport.write(b"".join([
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(text)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n", text]))
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap and not self._evict_one():
                stats.closed["refused_full"] += 1
                self.connections.discard(self)
                transport.abort()
                return
            stats.open_connections = len(self.connections)
            idle[self] = None
            self._arm("header_timeout", limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            idle.pop(self, None)
            self._disarm()
            super().connection_lost(exc)
            stats.open_connections = len(self.connections)

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()
            self._arm("body_timeout", limits.body_timeout_s)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                # Waiting for the next request: uvicorn's keep-alive timer runs until its first
                # byte, this one until its headers are complete.
                idle[self] = None
                self._in_head, self._raw_head_bytes = True, 0
                self._arm("header_timeout", limits.header_timeout_s)

        def _evict_one(self) -> bool:
            for victim in idle:
                if victim is not self:
                    del idle[victim]
                    stats.closed["evicted_idle"] += 1
                    victim.connections.discard(victim)
                    victim.transport.abort()
                    return True
            return False

        def _arm(self, reason: str, after_s: float) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(after_s, self._too_slow, reason)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self, reason: str) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                stats.closed[reason] += 1
                self.transport.abort()

        def __hash__(self) -> int:
            return id(self)

        def __eq__(self, other: Any) -> bool:
            return self is other

    return GuardedProtocol
