"""CPU a rank wanted and did not get: run-queue wait of its main thread, and its cgroup's quota throttling.

A rank slowed by a neighbour on its cores, a pinning to too few of them, or a CPU quota shows low CPU
use like a rank that waits on its peers; these two say which. Both are kernel counters turned into a
share of the interval since the previous sample:

- /proc/PID/schedstat: ns on a CPU, ns runnable but waiting on a run queue (run_delay), timeslices;
  /proc/PID's is the main thread's, where the training loop runs.
- cpu.stat of the rank's cgroup: ``throttled_usec`` (cgroup v2) or ``throttled_time`` in ns (v1).
  The kernel sums it over the CPUs whose run queues were throttled, so several CPUs can take it past 100.

The parsers are pure; the sampler takes the proc root and the cgroup mounts so tests can point it elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_PERCENT = 1e4  # the wire's bound
DEFAULT_V1_CPU = "/sys/fs/cgroup/cpu"  # where mountinfo cannot be read
DEFAULT_V2 = "/sys/fs/cgroup"


def parse_schedstat(text: str) -> int | None:
    """run_delay (ns waiting on a run queue), the second of /proc/PID/schedstat's three numbers."""
    parts = text.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """(the v1 cgroup holding the "cpu" controller, the v2 cgroup) from /proc/PID/cgroup; None: not there.

    v1 lines are "ID:controller,controller:/path", v2's is "0::/path"."""
    v1 = v2 = None
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2):
            continue
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v1, v2


def parse_throttled_ns(text: str) -> int | None:
    """Throttled time in ns from a cpu.stat: v2's ``throttled_usec`` or v1's ``throttled_time`` (ns)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if not value.strip().isdigit():
            continue
        if key == "throttled_usec":
            return int(value) * 1000
        if key == "throttled_time":
            return int(value)
    return None


@dataclass(frozen=True)
class CgroupMounts:
    """Where the cpu controller's hierarchies are mounted: (mount point, the hierarchy path at its root)."""

    v1_cpu: tuple[str, str] | None = None
    v2: tuple[str, str] | None = None

    def cpu_stat(self, v1_path: str | None, v2_path: str | None) -> tuple[str, str] | None:
        """(the cgroup's path, its cpu.stat file), the v1 cpu hierarchy first: on a hybrid host it has the
        controller and the v2 hierarchy only the core counters."""
        for mount, path in ((self.v1_cpu, v1_path), (self.v2, v2_path)):
            if mount is not None and path is not None:
                point, root = mount
                inside = path[len(root):] if root != "/" and path.startswith(root) else path
                return path, f"{point.rstrip('/')}/{inside.strip('/')}/cpu.stat".replace("//", "/")
        return None


def parse_mountinfo(text: str) -> CgroupMounts:
    """The cgroup mounts from /proc/self/mountinfo: "ID PARENT DEV ROOT POINT OPTS [TAGS] - TYPE SRC SUPER"."""
    v1 = v2 = None
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(after) < 3:
            continue
        root, point = fields[3], fields[4]
        if after[0] == "cgroup2" and v2 is None:
            v2 = (point, root)
        elif after[0] == "cgroup" and "cpu" in after[2].split(",") and v1 is None:
            v1 = (point, root)
    return CgroupMounts(v1, v2)


def read_mounts(proc_root: str = "/proc") -> CgroupMounts:
    try:
        with open(f"{proc_root}/self/mountinfo") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return CgroupMounts((DEFAULT_V1_CPU, "/"), (DEFAULT_V2, "/"))


def percent(delta_ns: int, seconds: float) -> float | None:
    if delta_ns < 0 or seconds <= 0:
        return None
    return round(min(delta_ns / 1e9 / seconds * 100.0, MAX_PERCENT), 1)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


@dataclass(frozen=True)
class _Counters:
    at: float
    run_delay_ns: int | None
    throttled_ns: int | None


@dataclass
class SchedSampler:
    """Turns successive readings into the SchedReport dict; keeps one reading and the cgroup per pid."""

    proc_root: str = "/proc"
    mounts: CgroupMounts | None = None  # None: read from the agent's own mountinfo on first use
    _prev: dict[int, _Counters] = field(default_factory=dict)
    _cgroups: dict[int, tuple[str, str] | None] = field(default_factory=dict)  # pid -> (path, cpu.stat)
    # cpu.stat read once per sample time and file: the ranks of one job mostly share one cgroup,
    # and a node of 8 ranks would otherwise read the same file 8 times a tick.
    _stats_at: float | None = None
    _stats: dict[str, str | None] = field(default_factory=dict)

    def sample(self, pid: int, now: float) -> dict | None:
        """The SchedReport dict over the interval since the previous sample; None on the first."""
        text = _read(f"{self.proc_root}/{pid}/schedstat")
        cgroup = self._cgroup(pid)
        throttled_text = self._cpu_stat(cgroup[1], now) if cgroup else None
        current = _Counters(now, parse_schedstat(text) if text else None,
                            parse_throttled_ns(throttled_text) if throttled_text else None)
        before = self._prev.get(pid)
        self._prev[pid] = current
        if before is None:
            return None
        seconds = now - before.at

        def share(now_ns: int | None, before_ns: int | None) -> float | None:
            return percent(now_ns - before_ns, seconds) if now_ns is not None and before_ns is not None else None

        return {
            "run_queue_wait_percent": share(current.run_delay_ns, before.run_delay_ns),
            "cpu_throttled_percent": share(current.throttled_ns, before.throttled_ns),
            "cgroup": cgroup[0] if cgroup else "",
        }

    def _cpu_stat(self, path: str, now: float) -> str | None:
        if now != self._stats_at:
            self._stats_at, self._stats = now, {}
        if path not in self._stats:
            self._stats[path] = _read(path)
        return self._stats[path]

    def _cgroup(self, pid: int) -> tuple[str, str] | None:
        if pid not in self._cgroups:
            if self.mounts is None:
                self.mounts = read_mounts(self.proc_root)
            text = _read(f"{self.proc_root}/{pid}/cgroup")
            found = self.mounts.cpu_stat(*parse_proc_cgroup(text)) if text else None
            # The wire takes no control characters, and paths up to 1024 characters.
            self._cgroups[pid] = ("".join(c for c in found[0] if c.isprintable())[:1024], found[1]) if found else None
        return self._cgroups[pid]

    def forget(self, pid: int) -> None:
        self._prev.pop(pid, None)
        self._cgroups.pop(pid, None)
