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

# File descriptors left for the database, logs, token files and the process's own pipes.
RESERVED_FDS = 64
CLOSE_REASONS = ("header_timeout", "body_timeout", "evicted_idle", "refused_full")


@dataclass
class HttpStats:
    """What the connection guards and the token checks (monitor/auth.py) turned away, for /metrics."""

    open_connections: int = 0
    closed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLOSE_REASONS, 0))
    # Requests refused with 401, by kind: "ingest", "read", "metrics".
    unauthorized: dict[str, int] = field(default_factory=lambda: {"ingest": 0, "read": 0, "metrics": 0})


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 4096
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0


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

        def on_message_begin(self) -> None:
            idle.pop(self, None)
            super().on_message_begin()

        def on_headers_complete(self) -> None:
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
