"""The agent's own CPU and memory: measured every tick, reported, and kept under caps.

- CPU is the agent's and its finished children's (py-spy: most of what the agent costs) time
  from ``os.times()``: reported as a percent of one core over the last tick, and capped on its
  mean over a window. Over the cap the agent backs off: it starts no stack dump until the
  window's mean is under the cap again, so dumps go on, less often.
- Memory is the agent's resident set. Past the cap the agent exits with status 3 and systemd
  (Restart=on-failure) or Kubernetes starts a fresh one: a leak is cured by a restart, and an
  orderly exit beats the cgroup's SIGKILL (MemoryMax=) in the middle of a report.
- Priority: the sampling loop runs at nice 5 at least (``--nice``), below the training it
  watches; py-spy inherits it.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass

from agent.procstat import PAGE_SIZE

log = logging.getLogger(__name__)

EXIT_OVER_MEMORY = 3  # not 2: the unit's RestartPreventExitStatus (a usage error)
MIN_NICE = 5
DEFAULT_MAX_RSS_MB = 256
DEFAULT_MAX_CPU_PERCENT = 25.0
CPU_WINDOW_S = 30.0


@dataclass(frozen=True)
class Limits:
    max_rss_bytes: int | None = DEFAULT_MAX_RSS_MB * 2**20  # None: no cap
    max_cpu_percent: float | None = DEFAULT_MAX_CPU_PERCENT  # 100 = one core; None: no cap
    window_s: float = CPU_WINDOW_S


@dataclass(frozen=True)
class Usage:
    cpu_percent: float | None  # over the last tick
    window_cpu_percent: float | None  # over the window; None until half a window is seen
    rss_bytes: int | None


def usage_of(points: list[tuple[float, float]], rss_bytes: int | None, window_s: float) -> Usage:
    """``points``: (monotonic time, CPU seconds so far), oldest first, covering the window."""

    def percent(a: tuple[float, float], b: tuple[float, float]) -> float | None:
        wall = b[0] - a[0]
        return round(max(0.0, b[1] - a[1]) / wall * 100.0, 1) if wall > 0 else None

    if len(points) < 2:
        return Usage(None, None, rss_bytes)
    # Half a window at least: a start-up tick (the first full /proc scan) is no trend.
    seen = points[-1][0] - points[0][0] >= window_s / 2
    return Usage(percent(points[-2], points[-1]), percent(points[0], points[-1]) if seen else None, rss_bytes)


def back_off_reason(usage: Usage, limits: Limits) -> str | None:
    """Why stack dumps wait now (one line), or None."""
    cap, used = limits.max_cpu_percent, usage.window_cpu_percent
    if cap is None or used is None or used <= cap:
        return None
    return (f"backing off: the agent used {used:.0f}% of a core over {limits.window_s:.0f} s "
            f"(cap {cap:.0f}%, --max-cpu-percent): no new stack dumps until it is under")


def over_memory(usage: Usage, limits: Limits) -> str | None:
    """Why the agent must exit (one line), or None."""
    cap, rss = limits.max_rss_bytes, usage.rss_bytes
    if cap is None or rss is None or rss <= cap:
        return None
    return f"the agent's resident memory is {rss // 2**20} MiB, over --max-rss-mb {cap // 2**20}: exiting to be restarted"


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def own_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def lower_priority(min_nice: int = MIN_NICE) -> int:
    """Raise the agent's nice value to ``min_nice`` unless it is higher already (0: leave it); the new value."""
    current = os.nice(0)
    return os.nice(min_nice - current) if 0 < min_nice and current < min_nice else current


class SelfWatch:
    """Samples the agent's own usage once per tick; says when to back off and when to exit."""

    def __init__(self, limits: Limits = Limits(), cpu_seconds=own_cpu_seconds, rss_bytes=own_rss_bytes,
                 clock=time.monotonic):
        self.limits = limits
        self._cpu_seconds, self._rss_bytes, self._clock = cpu_seconds, rss_bytes, clock
        self._points: deque[tuple[float, float]] = deque()
        self.usage = Usage(None, None, None)

    def sample(self) -> Usage:
        now = self._clock()
        self._points.append((now, self._cpu_seconds()))
        # Keep one point at or before the window's start, so the window is covered whole.
        while len(self._points) > 2 and self._points[1][0] <= now - self.limits.window_s:
            self._points.popleft()
        self.usage = usage_of(list(self._points), self._rss_bytes(), self.limits.window_s)
        return self.usage

    def back_off(self) -> str | None:
        return back_off_reason(self.usage, self.limits)

    def must_exit(self) -> str | None:
        return over_memory(self.usage, self.limits)
