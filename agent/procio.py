"""Bytes written by a process, from /proc/PID/io.

wchar counts every write()/send(), so it includes gloo's socket sends: bytes
still going out while a rank "waits" mean communication, not deadlock.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def parse_io(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            out[key.strip()] = int(value)
    return out


def read_io(proc_root: str, pid: int) -> dict[str, int]:
    with open(f"{proc_root}/{pid}/io") as f:
        return parse_io(f.read())


@dataclass
class WriteRateSampler:
    proc_root: str = "/proc"
    _prev: dict[int, tuple[int, float]] = field(default_factory=dict)

    def sample(self, pid: int, now: float) -> tuple[int | None, float | None]:
        """(wchar, bytes written per second since the previous sample)."""
        wchar = read_io(self.proc_root, pid).get("wchar")
        if wchar is None:
            return None, None
        prev = self._prev.get(pid)
        self._prev[pid] = (wchar, now)
        if prev is None or now <= prev[1] or wchar < prev[0]:
            return wchar, None
        return wchar, round((wchar - prev[0]) / (now - prev[1]), 1)

    def forget(self, pid: int) -> None:
        self._prev.pop(pid, None)
