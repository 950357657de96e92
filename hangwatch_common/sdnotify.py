"""systemd's notify protocol (sd_notify) in a few lines of stdlib, for the agent and the monitor.

Under a ``Type=notify`` unit systemd sets ``NOTIFY_SOCKET`` (a path, or ``@name`` for the
abstract namespace); with ``WatchdogSec=`` it also sets ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``).
Each message is one datagram of ``KEY=VALUE`` lines. Outside systemd every call is a no-op, so
the main loops call it unconditionally::

    notifier = Notifier.from_env()
    notifier.ready("watching 2 ranks")          # READY=1, once start-up is done
    while running:
        ...
        notifier.tick()                          # WATCHDOG=1 when half the watchdog interval has passed
        notifier.status_on_change(readiness)     # STATUS=..., sent only when the text changes
    notifier.stopping()

``tick`` and ``status_on_change`` are cheap (a clock read, a comparison) and may be called more often
than the watchdog needs.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping


def _address(name: str) -> str:
    # A leading "@" names a socket in the abstract namespace: a NUL byte on the wire.
    return "\0" + name[1:] if name.startswith("@") else name


def watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds between keep-alives (half of ``WATCHDOG_USEC``), or None if no watchdog is set for us."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None  # the watchdog belongs to another process (e.g. our parent)
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1e6 if value > 0 else None


class Notifier:
    def __init__(self, socket_name: str | None, watchdog_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_name = socket_name or None
        self.watchdog_s = watchdog_s if self.socket_name else None
        self._clock = clock
        self._last_ping: float | None = None
        self._sock: socket.socket | None = None
        self._status: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic) -> Notifier:
        env = os.environ if env is None else env
        return cls(env.get("NOTIFY_SOCKET"), watchdog_interval(env), clock)

    @property
    def enabled(self) -> bool:
        return self.socket_name is not None

    def notify(self, *lines: str) -> bool:
        """Send one message; False if there is no socket or it could not be sent (never raises)."""
        if not self.socket_name:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), _address(self.socket_name))
            return True
        except OSError:
            # systemd gone or the socket not there: the service must keep working regardless.
            return False

    def ready(self, status: str | None = None) -> bool:
        lines = ["READY=1", f"MAINPID={os.getpid()}"]
        if status:
            lines.append(f"STATUS={status}")
            self._status = status
        sent = self.notify(*lines)
        self._last_ping = self._clock()
        return sent

    def status(self, text: str) -> bool:
        self._status = text
        return self.notify(f"STATUS={text}")

    def status_on_change(self, text: str) -> bool:
        """STATUS=text unless it is what systemd was last told; True when sent."""
        if not self.enabled or text == self._status:
            return False
        return self.status(text)

    def tick(self) -> bool:
        """WATCHDOG=1 if a watchdog is set and half its interval has passed since the last one."""
        if self.watchdog_s is None:
            return False
        now = self._clock()
        if self._last_ping is not None and now - self._last_ping < self.watchdog_s:
            return False
        self._last_ping = now
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
