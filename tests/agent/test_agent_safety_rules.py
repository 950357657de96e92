"""The agent's safety rules as pure functions: whom py-spy may dump, and the agent's own limits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from agent.cli import UsageError, parse_config
from agent.runner import Agent, Config
from agent.selfwatch import (
    EXIT_OVER_MEMORY,
    Limits,
    SelfWatch,
    Usage,
    back_off_reason,
    over_memory,
    own_rss_bytes,
    usage_of,
)
from agent.targets import Dumper, Target, dump_refusal, parse_uids, read_target

ROOT = Path(__file__).resolve().parents[2]
ME = Dumper(pid=100, ppid=99, uid=1000)
PY = "/usr/bin/python3.11"


def target(pid=200, ppid=150, uids=(1000, 1000, 1000, 1000), exe=PY, argv=("python", "train.py")) -> Target:
    return Target(pid, ppid, uids, exe, tuple(argv))


@pytest.mark.parametrize(
    "case, proc, me, refusal",
    [
        ("a rank of the agent's user", target(), ME, None),
        ("the agent itself", target(pid=100, ppid=99), ME, "not dumped: it is the agent itself"),
        ("the agent's parent", target(pid=99, ppid=1), ME, "not dumped: it is the agent's parent"),
        ("py-spy, the agent's child", target(ppid=100, exe="/usr/bin/py-spy", argv=("py-spy",)), ME,
         "not dumped: it is the agent's child"),
        ("a shell", target(exe="/usr/bin/bash", argv=("bash", "run.sh")), ME,
         "not dumped: not a Python process (bash)"),
        ("timeout wrapping python", target(exe="/usr/bin/timeout", argv=("timeout", "60", "python")), ME,
         "not dumped: not a Python process (timeout)"),
        ("exe unreadable, argv[0] python3", target(exe="", argv=("/opt/venv/bin/python3", "-m", "x")), ME, None),
        ("exe unreadable, not python", target(exe="", argv=("/usr/bin/nvidia-smi",)), ME,
         "not dumped: not a Python process (nvidia-smi)"),
        ("torchrun's worker: python exe, argv of the script", target(argv=("/usr/bin/python3", "-u", "t.py")), ME, None),
        ("nothing known", target(exe="", argv=()), ME, "not dumped: not a Python process (unknown)"),
        ("another user's rank", target(uids=(1001, 1001, 1001, 1001)), ME,
         "not dumped: process of uid 1001 (start the agent with --dump-other-users)"),
        ("a root agent, a user's rank", target(uids=(1001,) * 4), Dumper(100, 99, 0),
         "not dumped: process of uid 1001 (start the agent with --dump-other-users)"),
        ("a root agent with --dump-other-users", target(uids=(1001,) * 4), Dumper(100, 99, 0, True), None),
        ("setuid to another user", target(uids=(1000, 0, 0, 0)), ME,
         "not dumped: process of uid 0 (start the agent with --dump-other-users)"),
        ("owner unknown", target(uids=None), ME, "not dumped: its owner is unknown"),
        ("--dump-other-users never allows the agent itself", target(pid=100), Dumper(100, 99, 0, True),
         "not dumped: it is the agent itself"),
    ],
)
def test_dump_refusal(case, proc, me, refusal):
    assert dump_refusal(proc, me) == refusal, case


def test_parse_uids():
    assert parse_uids("Name:\tpython\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\t5\t5\t5\n") == (1000, 1001, 1002, 1003)
    assert parse_uids("Name:\tx\n") is None
    assert parse_uids("Uid:\tx\ty\tz\tw\n") is None
    assert parse_uids("Uid:\t1\n") is None


def test_read_target_of_this_process():
    me = read_target("/proc", os.getpid())
    assert me.pid == os.getpid() and me.ppid == os.getppid()
    assert me.uids[:3] == (os.getuid(), os.geteuid(), os.getresuid()[2])
    assert os.path.basename(me.exe).startswith("python") and me.argv
    assert dump_refusal(me, Dumper.current()) == "not dumped: it is the agent itself"


# --- the agent's own limits -----------------------------------------------------------


def test_usage_over_the_last_tick_and_the_window():
    assert usage_of([(0.0, 1.0)], 10, 30.0) == Usage(None, None, 10)
    # 1 s of CPU in 10 s over the window; the last tick 0.5 s in 1 s.
    points = [(0.0, 1.0), (9.0, 1.5), (10.0, 2.0)]
    assert usage_of(points, 10, 20.0) == Usage(50.0, 10.0, 10)
    # Less than half a window seen: no trend yet.
    assert usage_of(points, 10, 30.0).window_cpu_percent is None
    assert usage_of([(0.0, 1.0), (0.0, 1.0)], None, 0.0).cpu_percent is None  # no time passed


@pytest.mark.parametrize(
    "window_cpu, cap, backs_off",
    [(None, 25.0, False), (10.0, 25.0, False), (25.0, 25.0, False), (25.1, 25.0, True), (90.0, None, False)],
)
def test_back_off_when_over_the_cpu_cap(window_cpu, cap, backs_off):
    reason = back_off_reason(Usage(1.0, window_cpu, 0), Limits(max_cpu_percent=cap, window_s=30))
    assert (reason is not None) == backs_off
    if backs_off:
        assert reason.startswith("backing off: the agent used 25% of a core over 30 s (cap 25%")


@pytest.mark.parametrize(
    "rss_mb, cap_mb, exits",
    [(None, 256, False), (100, 256, False), (256, 256, False), (257, 256, True), (9000, None, False)],
)
def test_exit_when_over_the_memory_cap(rss_mb, cap_mb, exits):
    usage = Usage(None, None, rss_mb * 2**20 if rss_mb is not None else None)
    reason = over_memory(usage, Limits(max_rss_bytes=cap_mb * 2**20 if cap_mb else None))
    assert (reason is not None) == exits
    if exits:
        assert reason == "the agent's resident memory is 257 MiB, over --max-rss-mb 256: exiting to be restarted"


class FakeClock:
    def __init__(self):
        self.now, self.cpu = 0.0, 0.0

    def tick(self, wall: float, cpu: float) -> None:
        self.now += wall
        self.cpu += cpu


def test_selfwatch_backs_off_and_recovers_over_a_sliding_window():
    c = FakeClock()
    watch = SelfWatch(Limits(max_cpu_percent=25.0, window_s=10.0), cpu_seconds=lambda: c.cpu,
                      rss_bytes=lambda: 5, clock=lambda: c.now)
    watch.sample()
    for _ in range(10):  # 50% of a core for 10 s
        c.tick(1.0, 0.5)
        watch.sample()
    assert watch.usage == Usage(50.0, 50.0, 5)
    assert watch.back_off() is not None
    for _ in range(6):  # idle: the window's mean falls to 20% (4 busy seconds out of 10)
        c.tick(1.0, 0.0)
        watch.sample()
    assert watch.usage.window_cpu_percent == 20.0 and watch.back_off() is None
    assert len(watch._points) == 11  # the window, not the whole history


def test_own_rss_is_measured():
    assert 1 << 20 < own_rss_bytes() < 4 << 30


def test_lower_priority_raises_nice_to_5_at_least():
    code = ("from agent.selfwatch import lower_priority; import os; start = os.nice(0); a = lower_priority(); "
            "os.nice(1); print(start, a, lower_priority(), lower_priority(0), os.nice(0))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    start, first, again, left, now = map(int, done.stdout.split())
    assert first == max(start, 5)
    assert again == left == now == min(first + 1, 19)  # never lowered back


class NullSender:
    def offer(self, report: dict) -> None:
        self.last = report


class QuietNotifier:
    def ready(self, text: str) -> None: ...
    def tick(self) -> None: ...
    def stopping(self) -> None: ...


def test_agent_reports_its_own_use_and_exits_3_past_the_memory_cap(tmp_path):
    agent = Agent(Config(stacks=False, nccl_ras=False, flight_recorder=False, jobs=frozenset({"none"})))
    try:
        report = agent.tick()
        assert report["agent"]["rss_bytes"] > 1 << 20
        report = agent.tick()
        assert report["agent"]["cpu_percent"] is not None
        agent.selfwatch = SelfWatch(Limits(max_rss_bytes=2**20), rss_bytes=lambda: 2**30)
        stop = threading.Event()
        sender = NullSender()
        agent.run(stop, sender, QuietNotifier())  # returns by itself
        assert agent.exit_status == EXIT_OVER_MEMORY and not stop.is_set()
        assert sender.last["agent"]["rss_bytes"] == 2**30
    finally:
        agent.close()


def test_agent_backs_off_stack_dumps_over_the_cpu_cap(tmp_path):
    agent = Agent(Config(py_spy="/nonexistent/py-spy", nccl_ras=False, flight_recorder=False,
                         jobs=frozenset({"none"})))
    try:
        cpu = iter(range(0, 10_000, 5))  # 5 s of CPU per second of wall time: 500%
        wall = iter(range(0, 10_000))
        agent.selfwatch = SelfWatch(Limits(max_cpu_percent=25.0, window_s=2.0), cpu_seconds=lambda: next(cpu),
                                    clock=lambda: next(wall))
        entries = []
        for _ in range(3):
            report = agent.tick()
            entries.append(next(c for c in report["collectors"] if c["name"] == "stacks"))
        # At first the py-spy problem shows (dumps were scheduled), then the back-off.
        assert "not found" in entries[0]["error"]
        assert entries[-1]["error"].startswith("backing off: the agent used 500% of a core over 2 s")
    finally:
        agent.close()


# --- the command line and the shipped deployments ----------------------------------------


def test_dump_other_users_is_off_unless_configured():
    base = ["--monitor", "http://127.0.0.1:8787"]
    assert parse_config(base, environ={})[0].dump_other_users is False
    assert parse_config([*base, "--dump-other-users"], environ={})[0].dump_other_users is True
    assert parse_config(base, environ={"HANGWATCH_DUMP_OTHER_USERS": "1"})[0].dump_other_users is True
    assert parse_config(base, environ={"HANGWATCH_DUMP_OTHER_USERS": "0"})[0].dump_other_users is False
    assert parse_config(base, environ={"HANGWATCH_DUMP_OTHER_USERS": ""})[0].dump_other_users is False
    on = {"HANGWATCH_DUMP_OTHER_USERS": "1"}
    assert parse_config([*base, "--no-dump-other-users"], environ=on)[0].dump_other_users is False
    with pytest.raises(UsageError, match="HANGWATCH_DUMP_OTHER_USERS must be one of 1, 0, true, false"):
        parse_config(base, environ={"HANGWATCH_DUMP_OTHER_USERS": "maybe"})


def test_self_limit_options():
    base = ["--monitor", "http://127.0.0.1:8787"]
    config = parse_config(base, environ={})[0]
    assert (config.max_rss_mb, config.max_cpu_percent, config.nice) == (256, 25.0, 0)
    config = parse_config([*base, "--max-rss-mb", "0", "--max-cpu-percent", "0", "--nice", "5"], environ={})[0]
    assert (config.max_rss_mb, config.max_cpu_percent, config.nice) == (None, None, 5)
    for bad in (["--max-rss-mb", "-1"], ["--max-cpu-percent", "nan"], ["--max-rss-mb", "lots"], ["--nice", "20"],
                ["--nice", "-5"]):
        with pytest.raises(UsageError):
            parse_config([*base, *bad], environ={})


def test_shipped_deployments_turn_dump_other_users_on_and_cap_the_agent():
    unit = (ROOT / "deploy/systemd/hangwatch-agent.service").read_text().splitlines()
    assert "Environment=HANGWATCH_DUMP_OTHER_USERS=1" in unit
    for key in ("CPUQuota=", "MemoryHigh=", "MemoryMax=", "TasksMax=", "Nice="):
        assert any(line.startswith(key) for line in unit), key
    docs = yaml.safe_load_all((ROOT / "deploy/kubernetes/agent-daemonset.yaml").read_text())
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert "--dump-other-users" in container["args"]
    assert {"cpu", "memory"} <= container["resources"]["limits"].keys()


def _start_error(argv: list[str], environ: dict[str, str]) -> str:
    """The one-line UsageError the agent would exit 2 with at start, from parse_config or make_sender."""
    from agent.cli import make_sender, setting_names

    with pytest.raises(UsageError) as info:
        config, args = parse_config(argv, environ=environ)
        make_sender(config, setting_names(args))
    return str(info.value)


@pytest.mark.parametrize(("variable", "option", "value", "problem"), [
    ("HANGWATCH_TOKEN_FILE", "--token-file", "{tmp}/missing-token", "cannot read token file"),
    ("HANGWATCH_TOKEN_FILE", "--token-file", "{tmp}/open-token", "chmod 600"),
    ("HANGWATCH_CA_FILE", "--ca-file", "{tmp}/missing-ca.pem", "missing-ca.pem"),
    ("HANGWATCH_OUTAGE_JOURNAL", "--outage-journal", "{tmp}/open-token/journal", "Not a directory"),
    ("HANGWATCH_DUMP_OTHER_USERS", None, "maybe", "must be one of 1, 0, true, false, yes, no, on, off, not 'maybe'"),
])
def test_settings_errors_name_the_variable_or_option(tmp_path, variable, option, value, problem):
    (tmp_path / "open-token").write_text("secret-token-0123456789\n")
    (tmp_path / "open-token").chmod(0o644)
    value = value.format(tmp=tmp_path)
    base = ["--monitor", "http://127.0.0.1:8787"]
    from_env = _start_error(base, {variable: value})
    assert from_env.startswith(variable) and problem in from_env and "\n" not in from_env, from_env
    if option is not None:
        from_option = _start_error([*base, option, value], {})
        assert from_option.startswith(option) and problem in from_option, from_option
    assert "secret-token" not in from_env
