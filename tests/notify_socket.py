"""A real systemd notify socket for tests: what a daemon under ``Type=notify`` would tell systemd."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path


class NotifySocket:
    """An AF_UNIX datagram socket at ``path``; ``messages`` holds every datagram received."""

    def __init__(self, path: Path, timeout: float = 15.0) -> None:
        self.path = path
        self.messages: list[str] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(timeout)

    def env(self, watchdog_usec: int) -> dict[str, str]:
        return {"NOTIFY_SOCKET": str(self.path), "WATCHDOG_USEC": str(watchdog_usec)}

    def wait_until(self, done: Callable[[list[str]], bool]) -> list[str]:
        """Receive until ``done(messages)``; a silent daemon fails with socket.timeout."""
        while not done(self.messages):
            self.messages.append(self._sock.recv(4096).decode())
        return self.messages

    def close(self) -> None:
        self._sock.close()
