"""CPU a rank was denied (agent/sched.py): parsers on fixture text, the sampler on a fixture tree, and real
busy processes crowded onto one core or held by a CPU quota."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agent.sched import (
    CgroupMounts,
    SchedSampler,
    parse_mountinfo,
    parse_proc_cgroup,
    parse_schedstat,
    parse_throttled_ns,
    read_mounts,
)
from monitor.ingest.wire import SchedReport

# --- parsers ---------------------------------------------------------------------------------------

V1_CGROUP = """9:name=systemd:/
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""
V1_DOCKER = "12:cpu,cpuacct:/docker/abc\n11:cpuset:/docker/abc\n1:name=systemd:/docker/abc\n"
V2_CGROUP = "0::/user.slice/user-1000.slice/session-2.scope\n"

V1_CPU_STAT = "nr_periods 50\nnr_throttled 7\nthrottled_time 123456789\nnr_bursts 0\nburst_time 0\n"
V2_CPU_STAT = ("usage_usec 100\nuser_usec 50\nsystem_usec 50\nnr_periods 10\nnr_throttled 2\n"
               "throttled_usec 3000\nnr_bursts 0\nburst_usec 0\n")
V2_NO_CPU_CONTROLLER = "usage_usec 100\nuser_usec 50\nsystem_usec 50\n"

HYBRID_MOUNTINFO = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_MOUNTINFO = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
CONTAINER_MOUNTINFO = ("1033 1030 0:27 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime master:11"
                       " - cgroup cgroup rw,cpu,cpuacct\n")


def test_parse_schedstat_takes_the_run_queue_wait():
    assert parse_schedstat("520882 3710259 2\n") == 3710259
    assert parse_schedstat("") is None and parse_schedstat("1") is None


@pytest.mark.parametrize("text, expected", [
    (V1_CGROUP, ("/", "/")),
    (V1_DOCKER, ("/docker/abc", None)),
    (V2_CGROUP, (None, "/user.slice/user-1000.slice/session-2.scope")),
    ("2:cpuacct:/a\n3:cpuset:/b\n", (None, None)),  # no "cpu" controller among them
    ("garbage\n", (None, None)),
])
def test_parse_proc_cgroup(text, expected):
    assert parse_proc_cgroup(text) == expected


@pytest.mark.parametrize("text, ns", [
    (V1_CPU_STAT, 123456789), (V2_CPU_STAT, 3_000_000), (V2_NO_CPU_CONTROLLER, None), ("", None),
])
def test_parse_throttled_ns(text, ns):
    assert parse_throttled_ns(text) == ns


def test_parse_mountinfo_finds_the_cpu_hierarchies():
    assert parse_mountinfo(HYBRID_MOUNTINFO) == CgroupMounts(("/sys/fs/cgroup/cpu", "/"), ("/sys/fs/cgroup/unified", "/"))
    assert parse_mountinfo(V2_MOUNTINFO) == CgroupMounts(None, ("/sys/fs/cgroup", "/"))
    assert parse_mountinfo(CONTAINER_MOUNTINFO).v1_cpu == ("/sys/fs/cgroup/cpu,cpuacct", "/docker/abc")


def test_the_cpu_stat_file_prefers_the_v1_cpu_hierarchy_and_strips_a_mount_root():
    hybrid = parse_mountinfo(HYBRID_MOUNTINFO)
    assert hybrid.cpu_stat("/", "/") == ("/", "/sys/fs/cgroup/cpu/cpu.stat")
    assert hybrid.cpu_stat("/job/a", "/") == ("/job/a", "/sys/fs/cgroup/cpu/job/a/cpu.stat")
    v2 = parse_mountinfo(V2_MOUNTINFO)
    assert v2.cpu_stat(None, "/system.slice/x.service") == ("/system.slice/x.service",
                                                             "/sys/fs/cgroup/system.slice/x.service/cpu.stat")
    container = parse_mountinfo(CONTAINER_MOUNTINFO)
    assert container.cpu_stat("/docker/abc", None) == ("/docker/abc", "/sys/fs/cgroup/cpu,cpuacct/cpu.stat")
    assert CgroupMounts().cpu_stat("/", "/") is None


# --- the sampler on a fixture tree ------------------------------------------------------------------

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_sampler_turns_counter_deltas_into_shares_of_the_interval(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cpu"
    _write(proc / "42" / "cgroup", "4:cpu,cpuacct:/job/rank0\n0::/\n")
    _write(proc / "42" / "schedstat", "100 1000000000 5\n")
    _write(cg / "job" / "rank0" / "cpu.stat", "throttled_time 0\n")
    sampler = SchedSampler(str(proc), CgroupMounts((str(cg), "/"), None))
    assert sampler.sample(42, 10.0) is None  # no interval yet
    _write(proc / "42" / "schedstat", "200 1500000000 9\n")  # +0.5 s waiting
    _write(cg / "job" / "rank0" / "cpu.stat", "throttled_time 3000000000\n")  # +3 s, summed over CPUs
    got = sampler.sample(42, 12.0)
    assert got == {"run_queue_wait_percent": 25.0, "cpu_throttled_percent": 150.0, "cgroup": "/job/rank0"}
    SchedReport.model_validate(got)
    sampler.forget(42)
    assert sampler.sample(42, 13.0) is None  # forgotten: a first sample again


def test_unreadable_counters_are_null_not_an_error(tmp_path):
    proc = tmp_path / "proc"
    _write(proc / "7" / "cgroup", "0::/gone\n")  # its cpu.stat is not there
    sampler = SchedSampler(str(proc), CgroupMounts(None, (str(tmp_path / "v2"), "/")))
    sampler.sample(7, 1.0)
    assert sampler.sample(7, 2.0) == {"run_queue_wait_percent": None, "cpu_throttled_percent": None,
                                      "cgroup": "/gone"}


# --- real processes ---------------------------------------------------------------------------------

BUSY = [sys.executable, "-c", "while True: pass"]


def _busy(cpu: int) -> subprocess.Popen:
    proc = subprocess.Popen(BUSY)
    os.sched_setaffinity(proc.pid, {cpu})
    return proc


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def _wait_share(sampler: SchedSampler, pid: int, seconds: float = 1.0) -> dict:
    sampler.sample(pid, time.monotonic())
    time.sleep(seconds)
    got = sampler.sample(pid, time.monotonic())
    assert got is not None
    SchedReport.model_validate(got)
    return got


@pytest.mark.live
@pytest.mark.cpu_bound
def test_a_rank_crowded_onto_one_core_waits_on_the_run_queue_and_one_alone_does_not():
    """Alone on a core, then with two more busy processes pinned to it: three on one core each wait about
    two thirds of the time. Alone, other work moves to the other cores; the quietest of a few cores (work
    pinned elsewhere, a burst of the suite's own) is the one judged."""
    procs = [_busy(min(os.sched_getaffinity(0)))]
    sampler = SchedSampler()
    try:
        tried = []
        for cpu in sorted(os.sched_getaffinity(0))[:4]:
            os.sched_setaffinity(procs[0].pid, {cpu})
            time.sleep(0.05)
            tried.append((_wait_share(sampler, procs[0].pid, 0.4)["run_queue_wait_percent"], cpu))
        alone, cpu = min(tried)
        os.sched_setaffinity(procs[0].pid, {cpu})
        procs += [_busy(cpu), _busy(cpu)]
        time.sleep(0.1)
        crowded = _wait_share(sampler, procs[0].pid)
    finally:
        _stop(procs)
    assert alone < 30, tried
    assert crowded["run_queue_wait_percent"] > 50, crowded


def _quota_cgroup(name: str) -> tuple[Path, Path] | None:
    """A child cgroup with a 10% CPU quota, made where this machine allows (cgroup v1's cpu hierarchy, or a
    v2 root delegating "cpu"): (the directory, its procs file); None where it cannot be made."""
    mounts = read_mounts()
    if mounts.v1_cpu:
        path = Path(mounts.v1_cpu[0]) / name
        files = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "10000"}
    elif mounts.v2 and "cpu" in (Path(mounts.v2[0]) / "cgroup.subtree_control").read_text().split():
        path = Path(mounts.v2[0]) / name
        files = {"cpu.max": "10000 100000"}
    else:
        return None
    try:
        path.mkdir()
        for file, value in files.items():
            (path / file).write_text(value)
    except OSError:
        if path.exists():
            path.rmdir()
        return None
    return path, path / "cgroup.procs"


@pytest.mark.live
@pytest.mark.cpu_bound
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a cgroup")
def test_a_rank_over_its_cgroups_cpu_quota_shows_throttling():
    made = _quota_cgroup(f"hwt-{uuid.uuid4().hex[:8]}")
    if made is None:
        pytest.skip("no writable cgroup hierarchy with the cpu controller")
    path, procs_file = made
    proc = subprocess.Popen(BUSY)
    try:
        procs_file.write_text(str(proc.pid))
        got = _wait_share(SchedSampler(), proc.pid)
        assert got["cgroup"].endswith(path.name)
        assert got["cpu_throttled_percent"] > 30, got  # wants a core, may use a tenth of one
    finally:
        _stop([proc])
        path.rmdir()
