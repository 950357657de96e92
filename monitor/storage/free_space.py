"""Free space on the volume under the monitor's files, read before captures and snapshots are written.

Captures (up to 4 GiB by default) and snapshots (up to 1 GiB) share the state volume with the
database, whose verdict history matters more than either: neither is written while the volume
has less than ``min_free_bytes`` free, so a filling volume refuses the expendable writes first
and leaves room for the history. Each refusal is counted by its writer; this says it in the log
at most once a minute per volume, not once per report. ``statvfs`` is one system call (about a
microsecond), read afresh each time: a volume freed by hand takes writes again at once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("hangwatch.monitor.store")

LOG_EVERY_S = 60.0
# 256 MiB: a few capture bundles' worth, and far more than the verdict history needs for days.
MIN_FREE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class VolumeSpace:
    """One reading of a volume: what it holds (``name``: store, captures), where, and how much is free."""

    name: str
    path: str
    free_bytes: int
    min_free_bytes: int

    @property
    def short(self) -> bool:
        return self.free_bytes < self.min_free_bytes


def mib(n: float) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


class FreeSpace:
    """The volume that holds ``path`` (or, before it exists, its nearest existing parent)."""

    def __init__(self, name: str, path: Path, min_free_bytes: int, *, clock: Callable[[], float] = time.monotonic,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        self.name, self.path, self.min_free_bytes = name, path, min_free_bytes
        self._clock, self._statvfs = clock, statvfs
        self._last_log: float | None = None

    def reading(self) -> VolumeSpace | None:
        """Free bytes now (those an unprivileged writer may use); None when the volume cannot be read."""
        path = self.path
        try:
            while not path.exists() and path.parent != path:
                path = path.parent
            st = self._statvfs(str(path))
        except OSError:  # a parent it may not search, say: no reading rather than an error in a probe
            return None
        return VolumeSpace(self.name, str(self.path), st.f_bavail * st.f_frsize, self.min_free_bytes)

    def refuses(self, what: str, incoming: int = 0) -> bool:
        """True when writing ``incoming`` more bytes would leave less than ``min_free_bytes`` free: the
        caller refuses ``what`` (and counts it); logged at most every LOG_EVERY_S."""
        if self.min_free_bytes <= 0:
            return False
        space = self.reading()
        if space is None or space.free_bytes - incoming >= self.min_free_bytes:
            return False
        self.log_refusal(what, space.free_bytes - incoming)
        return True

    def log_refusal(self, what: str, left_bytes: int) -> None:
        """``left_bytes``: what the write would have left free."""
        now = self._clock()
        if self._last_log is None or now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.error("the volume of %s would have %s free, under min_free_bytes (%s): %s refused (logged once "
                      "a minute while it lasts; counted on /metrics)", self.path, mib(max(left_bytes, 0)),
                      mib(self.min_free_bytes), what)
