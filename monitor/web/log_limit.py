"""Repeated log lines are rate-limited, so a hostile or broken client cannot fill the disk.

A monitor out of file descriptors once logged "Too many open files" for every accept attempt
(530 MB in 75 s); garbage requests log "Invalid HTTP request received." once each. Each
distinct message (logger and format string) may be logged ``burst`` times per ``window_s``;
the rest are dropped and counted, and the next one let through says how many were dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# Where floods come from: the event loop (accept failures), uvicorn (bad requests), ourselves.
LIMITED_LOGGERS = ("asyncio", "uvicorn.error", "hangwatch.monitor", "hangwatch.monitor.auth")
MAX_KEYS = 1024


class RepeatLimitFilter(logging.Filter):
    def __init__(self, burst: int = 5, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window_s, self._clock = burst, window_s, clock
        # (logger, format string) -> [window start, let through, dropped]
        self._seen: dict[tuple[str, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        key = (record.name, str(record.msg))
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self.window_s:
            dropped = int(entry[2]) if entry is not None else 0
            if entry is None and len(self._seen) >= MAX_KEYS:
                self._seen.clear()  # many distinct messages: start over rather than grow
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = f"{record.msg} [{dropped} more like this dropped in the last {self.window_s:.0f} s]"
            return True
        if entry[1] < self.burst:
            entry[1] += 1
            return True
        entry[2] += 1
        return False


def limit_repeated_logs(burst: int = 5, window_s: float = 60.0) -> RepeatLimitFilter:
    """Install one filter on every logger floods come from; returns it (tests read it)."""
    limiter = RepeatLimitFilter(burst, window_s)
    for name in LIMITED_LOGGERS:
        logging.getLogger(name).addFilter(limiter)
    return limiter
