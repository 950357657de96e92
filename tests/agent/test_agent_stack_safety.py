"""py-spy never leaves a rank stopped, and dumps only whom the rules allow: real processes, the
real py-spy, through the agent's own sampler."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import agent.stacks as stacks
from agent.procstat import read_stat, read_thread_stats
from agent.stacks import StackError, StackSampler, contended, find_py_spy, take_stack
from agent.targets import Dumper

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy not installed")

# Many threads with deep stacks: py-spy holds every thread of it stopped for tens of ms.
TARGET = textwrap.dedent(
    """
    import threading, time
    def deep(n, work):
        if n:
            return deep(n - 1, work)
        while True:
            if work:
                sum(i * i for i in range(1000))
            else:
                time.sleep(0.05)
    for _ in range(32):
        threading.Thread(target=deep, args=(150, False), daemon=True).start()
    print("ready", flush=True)
    deep(150, True)
    """
)


# The targets are started through this, so that they are not the test's (the agent's) children,
# which the rules never dump; it prints the target's pid once the target is ready.
LAUNCH = textwrap.dedent(
    """
    import subprocess, sys
    target = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
    assert target.stdout.readline().strip() == "ready"
    print(target.pid, flush=True)
    target.wait()
    """
)


class Target:
    def __init__(self, python: str, **popen):
        self.launcher = subprocess.Popen([python, "-c", LAUNCH, python, "-c", TARGET], stdout=subprocess.PIPE,
                                         text=True, **popen)
        self.pid = int(self.launcher.stdout.readline())

    def stop(self) -> None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                break
        self.launcher.wait(timeout=10)  # it ends with its target
        self.launcher.stdout.close()


@pytest.fixture
def target():
    t = Target(sys.executable)
    try:
        yield t.pid
    finally:
        t.stop()


def thread_states(pid: int) -> set[str]:
    return {t.state for t in read_thread_stats("/proc", pid)}


def tracer_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    return 0


def wait_until(predicate, timeout: float, step: float = 0.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if step:
            time.sleep(step)
    return predicate()


def assert_keeps_running(pid: int, timeout: float = 3.0) -> None:
    """Not stopped (no thread in T or t) and its CPU time moves again."""
    assert wait_until(lambda: not thread_states(pid) & {"T", "t"}, timeout, 0.01), thread_states(pid)
    before = read_stat("/proc", pid).cpu_ticks
    assert wait_until(lambda: read_stat("/proc", pid).cpu_ticks > before, timeout, 0.02), "target does not run"


def kill_py_spy_mid_dump(sampler: StackSampler, pid: int) -> set[str]:
    """Starts a native dump of ``pid`` on the sampler; freezes the py-spy it runs as soon as it
    attaches, notes which states the target's threads are in, SIGKILLs py-spy and waits for the
    sampler to take note. The states: {"t"} when py-spy was caught holding the target."""
    assert sampler.request(pid, native=True)
    held: set[str] = set()
    tracer = wait_until(lambda: tracer_of(pid), timeout=10.0)
    try:
        if tracer and read_stat("/proc", tracer).ppid == os.getpid():  # our py-spy, no other process
            os.kill(tracer, signal.SIGSTOP)
            wait_until(lambda: read_stat("/proc", tracer).state in ("T", "Z"), 5.0, 0.001)
            held = thread_states(pid) & {"t"}
            os.kill(tracer, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass  # the dump ended first
    wait_until(lambda: pid not in sampler._busy, 10.0, 0.01)
    return held


@needs_py_spy
def test_py_spy_killed_mid_dump_never_leaves_the_rank_stopped(target):
    """A real blocking (native) dump, caught while py-spy holds the target's threads stopped:
    py-spy is frozen there, then SIGKILLed. The rank must run again."""
    sampler = StackSampler(PY_SPY)
    try:
        for _attempt in range(10):
            sampler.forget(target)
            held = kill_py_spy_mid_dump(sampler, target)
            if held:
                break
        assert held, "never caught py-spy holding the target stopped"
        assert sampler.latest(target) == (None, "py-spy was killed by signal SIGKILL")
        assert_keeps_running(target)
        # And the next dump works.
        sampler.dump_now(target)
        stack, error = sampler.latest(target)
        assert error is None and stack["threads"], error
    finally:
        sampler.close()


# Stands in for py-spy's known failure (#390/#416: a SIGSTOP of its own left pending at the
# target): "stop-and-exit" stops the target and ends well; "late-stop" fails, and the stop lands
# a moment after it is gone.
FAKE_PY_SPY = textwrap.dedent(
    """
    import os, signal, sys, time
    pid, mode = int(sys.argv[sys.argv.index("--pid") + 1]), os.environ["FAKE_MODE"]
    if mode == "stop-and-exit":
        os.kill(pid, signal.SIGSTOP)
        print("[]")
        sys.exit(0)
    if mode == "hang":
        time.sleep(60)
    if mode == "slow":  # a dump that ends well, late (py-spy starved of CPU)
        time.sleep(float(os.environ["FAKE_SLOW_S"]))
        print("[]")
        sys.exit(0)
    parent = os.getpid()
    if os.fork() == 0:
        while os.getppid() == parent:
            time.sleep(0.001)
        time.sleep(0.03)  # after the agent saw py-spy end
        os.kill(pid, signal.SIGSTOP)
        os._exit(0)
    print("Error: lost the target", file=sys.stderr)
    sys.exit(1)
    """
)


@pytest.fixture
def fake_py_spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\n{FAKE_PY_SPY}")
    path.chmod(0o755)
    return str(path)


def test_a_stop_left_by_a_dump_is_undone(target, fake_py_spy, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "stop-and-exit")
    stack = take_stack(fake_py_spy, "/proc", target, native=False)
    assert stack["threads"] == []
    assert_keeps_running(target)


def test_a_stop_landing_after_a_failed_dump_is_undone(target, fake_py_spy, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "late-stop")
    with pytest.raises(StackError, match="py-spy failed: Error: lost the target") as failed:
        take_stack(fake_py_spy, "/proc", target, native=False)
    assert failed.value.reason == "failed"
    assert_keeps_running(target, timeout=1.0)


def test_a_dump_that_times_out_pauses_the_ranks_next_dumps_on_the_agents_clock(target, fake_py_spy, monkeypatch, caplog):
    """A timed-out dump (py-spy held the rank all the while) backs off: the pause is set on the clock
    the agent schedules with, so the next tick's plan sees it. The log says so (the next Python
    dump clears the rank's error, and its stack has no native frames)."""
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setattr(stacks, "run_dump", functools.partial(stacks.run_dump, timeout=0.3))
    caplog.set_level(logging.INFO, logger=stacks.log.name)
    sampler = StackSampler(fake_py_spy, clock=lambda: 1000.0)
    try:
        sampler.schedule(target, now=1000.0, stuck=True, state="S")  # stuck: a native dump
        assert wait_until(lambda: sampler.latest(target)[1], 10.0, 0.05)
        assert sampler.latest(target)[1].startswith("py-spy dump timed out")
        plan = sampler._plans[target]
        assert (plan.timeouts, plan.quiet_until, plan.native_off_until) == (1, 1005.0, 1060.0)
        assert wait_until(lambda: any("native dump: py-spy dump timed out" in m for m in caplog.messages), 5.0, 0.05)
        said = next(m for m in caplog.messages if "timed out" in m)
        assert said.startswith(f"pid {target}: ") and said.endswith("next dump in 5 s, Python-only for 60 s"), said
        sampler.schedule(target, now=1004.0, stuck=True, state="S")
        assert target not in sampler._busy  # still in the pause: no dump started
    finally:
        sampler.close()
    assert_keeps_running(target)


def test_a_native_dump_has_longer_than_a_python_one(target, fake_py_spy, monkeypatch):
    """Native unwinding is CPU-bound and grows with the machine's load (NATIVE_DUMP_TIMEOUT_S): a
    native dump may take longer than a Python one before it counts as timed out."""
    monkeypatch.setenv("FAKE_MODE", "slow")
    monkeypatch.setenv("FAKE_SLOW_S", "0.8")
    monkeypatch.setattr(stacks, "DUMP_TIMEOUT_S", 0.3)
    monkeypatch.setattr(stacks, "NATIVE_DUMP_TIMEOUT_S", 5.0)
    assert take_stack(fake_py_spy, "/proc", target, native=True)["native"] is True
    with pytest.raises(StackError, match="timed out") as timed_out:
        take_stack(fake_py_spy, "/proc", target, native=False)
    assert timed_out.value.reason == "timeout"
    assert_keeps_running(target)


def test_a_rank_stopped_before_the_dump_is_left_stopped(target, fake_py_spy):
    """Someone's SIGSTOP is evidence (a stopped rank): never dumped, never resumed."""
    os.kill(target, signal.SIGSTOP)
    assert wait_until(lambda: read_stat("/proc", target).state == "T", 5.0, 0.01)
    with pytest.raises(StackError, match="not dumped: process is in state T") as refused:
        take_stack(fake_py_spy, "/proc", target, native=False)
    assert refused.value.reason == "stopped" and not contended(refused.value)
    time.sleep(0.3)
    assert read_stat("/proc", target).state == "T"


# --- whom py-spy may dump -----------------------------------------------------------


def test_the_agent_its_parent_and_children_are_never_dumped(fake_py_spy):
    child = Target(sys.executable)  # the launcher is a Python child of this "agent"
    sampler = StackSampler(fake_py_spy)
    try:
        for pid, why in ((os.getpid(), "it is the agent itself"), (os.getppid(), "it is the agent's parent"),
                         (child.launcher.pid, "it is the agent's child")):
            sampler.dump_now(pid)
            assert sampler.latest(pid) == (None, f"not dumped: {why}")
    finally:
        sampler.close()
        child.stop()


def test_a_process_that_is_not_python_is_never_dumped(fake_py_spy):
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    sleeper = int(shell.stdout.readline())
    sampler = StackSampler(fake_py_spy)
    try:
        wait_until(lambda: os.readlink(f"/proc/{sleeper}/exe").endswith("sleep"), 5.0, 0.01)
        sampler.dump_now(sleeper)
        assert sampler.latest(sleeper) == (None, "not dumped: not a Python process (sleep)")
        assert sampler.recent_failures == 0  # a refusal is not a failing collector
    finally:
        sampler.close()
        os.kill(sleeper, signal.SIGKILL)
        shell.wait(timeout=10)
        shell.stdout.close()


SYSTEM_PYTHON = "/usr/bin/python3"
NOBODY = 65534


@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root (to start a process as another user) and /usr/bin/python3")
def test_other_users_processes_only_with_dump_other_users():
    theirs = Target(SYSTEM_PYTHON, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")
    mine, anyone = StackSampler(PY_SPY), StackSampler(PY_SPY, dumper=Dumper.current(dump_other_users=True))
    try:
        mine.dump_now(theirs.pid)
        assert mine.latest(theirs.pid) == (
            None, f"not dumped: process of uid {NOBODY} (start the agent with --dump-other-users)")
        anyone.dump_now(theirs.pid)
        stack, error = anyone.latest(theirs.pid)
        assert error is None and stack["threads"], error
        assert_keeps_running(theirs.pid)
    finally:
        mine.close()
        anyone.close()
        theirs.stop()


# Another tracer (a person's py-spy, a second agent): attaches to the rank, says so, holds it
# stopped for a moment, lets go.
HOLD_TRACED = textwrap.dedent(
    """
    import ctypes, os, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    pid, hold = int(sys.argv[1]), float(sys.argv[2])
    assert libc.ptrace(16, pid, None, None) == 0, ctypes.get_errno()  # PTRACE_ATTACH
    os.waitpid(pid, 0)
    print("attached", flush=True)
    time.sleep(hold)
    libc.ptrace(17, pid, None, 0)  # PTRACE_DETACH
    time.sleep(30)
    """
)


@needs_py_spy
def test_a_periodic_dump_that_meets_another_tracer_tries_again_once_it_lets_go(target):
    """Two tracers on one beat collide at every tick: the dump that found the rank traced tries
    once more after a short random pause and waits for the other to let go."""
    other = subprocess.Popen([sys.executable, "-c", HOLD_TRACED, str(target), "0.5"], stdout=subprocess.PIPE)
    try:
        assert other.stdout.readline() == b"attached\n"
        assert tracer_of(target) == other.pid
        # A dump that will not wait says who holds the rank.
        with pytest.raises(StackError, match=rf"state t \(traced by pid {other.pid}, python\S*, state \w\)") as met:
            take_stack(PY_SPY, "/proc", target, native=False)
        assert met.value.reason == "traced" and contended(met.value)
        sampler = StackSampler(PY_SPY)
        try:
            sampler.schedule(target, now=time.time(), stuck=True, state="S")
            assert wait_until(lambda: sampler.latest(target) != (None, None), 15.0, 0.05)
            stack, error = sampler.latest(target)
            assert error is None and stack and stack["threads"], (stack, error)
        finally:
            sampler.close()
    finally:
        other.kill()
        other.wait()
        other.stdout.close()


PARKED = textwrap.dedent(
    """
    import sys, time
    def parked():
        sys.stdin.readline()
    def moved_on():
        time.sleep(3600)
    print("ready", flush=True)
    parked()
    moved_on()
    """
)


@needs_py_spy
def test_a_stuck_ranks_native_dump_is_carried_by_python_dumps_until_it_moves() -> None:
    """A stuck rank's native dump (the expensive one) is taken once; the Python dumps after it,
    showing the rank where it was, carry its native frames forward with their own time; once a
    Python dump shows the rank moved, the next dump is native again."""
    # Through LAUNCH (not the test's child: the rules never dump those); the target reads its stdin.
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH, sys.executable, "-c", PARKED], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    pid = int(launcher.stdout.readline())
    clock = [100.0]
    sampler = StackSampler(PY_SPY, clock=lambda: clock[0])

    def dump(now: float) -> dict:
        clock[0] = now
        before = sampler.latest(pid)[0]
        sampler.schedule(pid, now=now, stuck=True, state="S")
        assert wait_until(lambda: sampler.latest(pid)[0] is not before and pid not in sampler._busy, 20.0, 0.05)
        stack, error = sampler.latest(pid)
        assert error is None and stack is not None, error
        return stack

    def python_names(stack: dict) -> list[str]:
        return [f["name"] for f in stack["threads"][0]["frames"] if not f["native"]]

    try:
        first = dump(100.0)  # the episode's start: native
        assert first["native"] and any(f["native"] for f in first["threads"][0]["frames"])
        assert "parked" in python_names(first)
        carried = dump(103.5)  # a Python dump, the rank where it was
        assert carried["threads"] == first["threads"] and carried["taken_at"] > first["taken_at"]
        assert sampler._plans[pid].last_native_at == 100.0
        launcher.stdin.write("go\n")
        launcher.stdin.flush()
        assert wait_until(lambda: "moved_on" in python_names(take_stack(PY_SPY, "/proc", pid, native=False)), 10.0, 0.1)
        moved = dump(107.0)  # a Python dump that sees it moved: kept as it is
        assert not moved["native"] and "moved_on" in python_names(moved)
        assert sampler._plans[pid].last_native_at is None
        again = dump(110.5)
        assert again["native"] and "moved_on" in python_names(again)
        # Native dumps off (after timeouts, say): a native dump is carried for a minute at most.
        sampler._plans[pid].native_off_until = 1000.0
        assert dump(113.6)["native"] and dump(170.4)["native"]  # still within the minute of 110.5
        late = dump(173.5)
        assert not late["native"] and "moved_on" in python_names(late)
    finally:
        sampler.close()
        os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        launcher.stdin.close()
        launcher.stdout.close()


def test_no_dump_can_hold_a_rank_stopped_long_enough_to_read_as_a_stopped_rank():
    """py-spy holds the rank in a tracing stop ("t") while it reads; one that hangs holds it until
    the timeout kills it. The monitor takes a tracing stop for a stopped rank only past
    TRACE_STOP_CONFIRM_S, and agent reports come a second apart: the longest dump stays under it."""
    from monitor.diagnosis.activity import TRACE_STOP_CONFIRM_S

    longest = max(stacks.DUMP_TIMEOUT_S, stacks.NATIVE_DUMP_TIMEOUT_S) + stacks.SETTLE_S
    assert longest + 1.0 < TRACE_STOP_CONFIRM_S
