"""Python (and native) stacks of the ranks, from py-spy.

Three parts: the parser of ``py-spy dump --json`` output (pure), the runner
(one py-spy process with a timeout, and the SIGCONT safety net for py-spy
issues #390/#416, where a dump can leave its target stopped), and the
scheduler that decides whom to dump when and runs at most two dumps at once.
Whom py-spy may dump at all is agent/targets.py's rule.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agent.procstat import read_stat
from agent.targets import Dumper, dump_refusal, read_target

log = logging.getLogger(__name__)

MAX_THREADS = 16
# How long a dump asked now waits for another tracer (state "t") to let go of the rank.
TRACED_WAIT_S = 2.0
# A periodic dump that failed while the rank may have been traced by another tool is tried once
# more after a random pause in this range: two tracers on a fixed beat (another agent, a person's
# py-spy loop) otherwise collide at every tick, and one of them never gets a stack.
CONTENDED_RETRY_S = (0.2, 0.8)
MAX_FRAMES = 64
DUMP_TIMEOUT_S = 5.0
# Native dumps are taken only of ranks that look stuck, and for evidence captures. py-spy's native
# unwinding of a gloo rank took 0.55 s on an idle 2-core machine, 2.0 s beside 6 busy processes and
# 3.9 s beside 12 (it is CPU-bound, so its wall time grows with the load), the rank held stopped for
# ~60% of it. CI saw 3.9 s: at 5 s such dumps timed out and turned native dumps off for a minute,
# when the stacks matter most. Twice what CI saw, and still well under the monitor's
# TRACE_STOP_CONFIRM_S (10 s; monitor/diagnosis/activity.py): a dump that holds the rank stopped
# until it is killed must not read as a stopped rank.
NATIVE_DUMP_TIMEOUT_S = 8.0
# How long a dump asked now (an evidence capture) waits for one of the rank already under way.
BUSY_WAIT_S = NATIVE_DUMP_TIMEOUT_S + 5.0
STOPPED_STATES = ("T", "t", "Z", "X")
# After a dump that did not end well (py-spy killed, timed out, crashed), how long the target
# is watched for a stop: a SIGSTOP a dying py-spy left pending lands after py-spy is gone.
SETTLE_S = 0.2


class StackError(Exception):
    """A dump failed; the message says why, in one line, and ``reason`` what kind of failure it was,
    for the policy: "timeout" (py-spy ran past its time), "failed" (py-spy exited with an error),
    "traced" (the rank was in another tracer's stop), "stopped", "killed", "unavailable" (no
    py-spy to run, no stack in the answer), or "other"."""

    def __init__(self, message: str, reason: str = "other") -> None:
        super().__init__(message)
        self.reason = reason


def find_py_spy(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def check_py_spy(path: str | None) -> str:
    """ "ok", or why stacks are unavailable (for AgentInfo.py_spy)."""
    if not path:
        return "py-spy not found on PATH"
    if not os.path.isfile(path):
        return f"py-spy not found at {path}"
    if not os.access(path, os.X_OK):
        return f"py-spy at {path} is not executable"
    return "ok"


def _frame(raw: dict) -> dict:
    # Native frames carry the shared object in "module" and line 0; Python ones module=None.
    native = raw.get("module") is not None
    line = raw.get("line")
    return {
        "name": str(raw.get("name") or "?")[:256],
        "file": str(raw.get("filename") or "")[:1024],
        "line": None if (native and not line) else line,
        "native": native,
    }


def parse_dump(
    text: str, pid: int, max_threads: int = MAX_THREADS, max_frames: int = MAX_FRAMES
) -> list[dict]:
    """ThreadStackReport dicts from py-spy's JSON (frames innermost first), main thread first."""
    threads = json.loads(text)
    if not isinstance(threads, list):
        raise StackError("py-spy printed no thread list")

    def is_main(t: dict) -> bool:
        return t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread"

    ordered = sorted(threads, key=lambda t: not is_main(t))  # stable: keeps py-spy's order
    return [
        {
            "tid": t.get("os_thread_id"),
            "name": str(t.get("thread_name") or "")[:256],
            "active": t.get("active"),
            "owns_gil": t.get("owns_gil"),
            "frames": [_frame(f) for f in (t.get("frames") or [])[:max_frames]],
        }
        for t in ordered[:max_threads]
    ]


def one_line(text: str) -> str:
    """The line that says what went wrong: py-spy's "Error: ..." (its Rust backtrace follows it, and
    its last line, "10: main", says nothing), else the last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:2048]


def contended(error: StackError) -> bool:
    """Whether a failed dump may have met another tracer: py-spy could not read the rank (it finds
    it attached), or the rank was in a ptrace stop; not a timeout, a kill or a refusal."""
    return error.reason in ("failed", "traced")


def run_dump(py_spy: str, pid: int, native: bool, timeout: float | None = None) -> str:
    if timeout is None:
        timeout = NATIVE_DUMP_TIMEOUT_S if native else DUMP_TIMEOUT_S
    argv = [py_spy, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # run() kills the child on timeout
        raise StackError(f"py-spy dump timed out after {timeout:.0f} s", "timeout") from None
    except OSError as e:
        raise StackError(f"cannot run py-spy: {e}", "unavailable") from None
    if done.returncode < 0:
        raise StackError(f"py-spy was killed by signal {_signal_name(-done.returncode)}", "killed")
    if done.returncode != 0:
        raise StackError(f"py-spy failed: {one_line(done.stderr or done.stdout)}", "failed")
    return done.stdout


def take_stack(py_spy: str, proc_root: str, pid: int, native: bool, clock=time.time, traced_wait_s: float = 0.0) -> dict:
    """Dump one rank: the StackReport dict. Never leaves the rank stopped. ``traced_wait_s``: how
    long to wait for another tracer to let go of the rank (a capture, which happens once, waits;
    the periodic dumps try again next tick instead of holding a py-spy worker)."""
    before = read_stat(proc_root, pid).state
    waited_until = time.monotonic() + traced_wait_s
    while before == "t" and time.monotonic() < waited_until:
        # Traced by another tool's dump (another agent's py-spy): over in a moment.
        time.sleep(0.1)
        before = read_stat(proc_root, pid).state
    if before in STOPPED_STATES:
        raise StackError(f"not dumped: process is in state {before}{tracer_note(proc_root, pid)}",
                         "traced" if before == "t" else "stopped")
    taken_at, started = clock(), time.monotonic()
    ended_well = False
    try:
        text = run_dump(py_spy, pid, native)
        ended_well = True
    except StackError as e:
        if e.reason == "timeout":
            # Who holds the rank, if anyone still does once our py-spy is gone: the evidence for a
            # rank that no dump can read (CI once saw two ranks in a tracing stop for 45 s).
            raise StackError(f"{e}{tracer_note(proc_root, pid)}", e.reason) from None
        raise
    finally:
        resume_if_left_stopped(proc_root, pid, watch_s=0.0 if ended_well else SETTLE_S)
    return {
        "taken_at": taken_at,
        "native": native,
        "duration_s": round(time.monotonic() - started, 3),
        "threads": parse_dump(text, pid),
    }


def tracer_note(proc_root: str, pid: int) -> str:
    """" (traced by pid N, COMM, state S)" when another process ptraces ``pid``, else ""."""
    try:
        for line in read_status(proc_root, pid).splitlines():
            if line.startswith("TracerPid:"):
                tracer = int(line.split()[1])
                break
        else:
            return ""
        if not tracer:
            return ""
        stat = read_stat(proc_root, tracer)
        return f" (traced by pid {tracer}, {stat.comm}, state {stat.state})"
    except (OSError, ValueError, IndexError):
        return ""


def resume_if_left_stopped(proc_root: str, pid: int, watch_s: float = 0.0) -> bool:
    """SIGCONT the target if it is in a group stop ("T"), or has a SIGSTOP pending, now or within
    ``watch_s``; True if sent.

    Called only after dumping a rank that was running (take_stack refuses a stopped one, which
    may be someone's deliberate SIGSTOP), so a stop seen now came from the dump. A ptrace stop
    ("t") ends by itself when py-spy dies; one that stays belongs to another tracer, and
    SIGCONT would not end it anyway.
    """
    deadline = time.monotonic() + watch_s
    while True:
        try:
            status = read_status(proc_root, pid)  # its State line and pending signals in one read
            if status_state(status) == "T" or stop_pending(status):
                os.kill(pid, signal.SIGCONT)  # also discards a SIGSTOP still pending
                log.warning("pid %d was left stopped after a py-spy dump: sent SIGCONT", pid)
                return True
        except (OSError, ValueError):
            return False  # gone
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def read_status(proc_root: str, pid: int) -> str:
    with open(os.path.join(proc_root, str(pid), "status")) as f:
        return f.read()


def status_state(status: str) -> str | None:
    """The state letter of ``/proc/PID/status`` ("State:\tT (stopped)" -> "T"); the same as stat's."""
    for line in status.splitlines():
        if line.startswith("State:"):
            return line[len("State:"):].strip()[:1] or None
    return None


def stop_pending(status: str) -> bool:
    """A SIGSTOP sent but not yet taken (``/proc/PID/status``'s ShdPnd or SigPnd): on a loaded
    machine a stop left by a dump can still be pending when py-spy has ended, and the rank would
    stop a moment after it was checked."""
    bit = 1 << (signal.SIGSTOP - 1)
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("ShdPnd", "SigPnd"):
            try:
                if int(value.strip(), 16) & bit:
                    return True
            except ValueError:
                continue
    return False


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


# --- when to dump -------------------------------------------------------------------

# Dumps start 2 s into a silence, so fresh stacks are at the monitor when its stall threshold
# (3.5 s at least) is reached.
STUCK_MIN_S = 2.0
LOW_CPU_PERCENT = 10.0
STUCK_DUMP_EVERY_S = 3.0
# A stuck rank's native dump (0.4-0.9 CPU-s of py-spy here, the rank held in a ptrace stop all the
# while) is taken at the start of its stuck episode and again this often, or at its next dump once
# a Python dump (a hundredth of the cost) shows the rank moved; between them, Python dumps that
# show it where the native one did carry the native one forward (``still_there``), for at most
# NATIVE_CARRY_MAX_S (native dumps may be off after timeouts: the native frames would grow old).
NATIVE_REFRESH_S = 30.0
NATIVE_CARRY_MAX_S = 2 * NATIVE_REFRESH_S
# After a dump that timed out: the pause before the next (doubling, up to the max), and how long
# native dumps stay off.
TIMEOUT_QUIET_MAX_S = 60.0
NATIVE_OFF_AFTER_TIMEOUT_S = 60.0
BACKGROUND_DUMP_EVERY_S = 20.0
FIRST_DUMP_AFTER_S = 2.0


def usual_step_interval(recent: list[tuple[float, int]]) -> float | None:
    """Mean time between progress events over the recent window.

    Not a per-gap median: the agent sees lines once per interval, so several steps
    share one timestamp and most gaps would read zero.
    """
    if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
        return None
    return (recent[-1][0] - recent[0][0]) / (len(recent) - 1)


def looks_stuck(now: float, progress: dict | None, low_cpu_since: float | None) -> bool:
    """No new progress for max(3 s, 3x the usual step time); without progress, idle CPU for 3 s."""
    if progress and progress.get("step_at") is not None:
        usual = usual_step_interval(progress.get("recent") or []) or 0.0
        return now - progress["step_at"] > max(STUCK_MIN_S, 3 * usual)
    return low_cpu_since is not None and now - low_cpu_since >= STUCK_MIN_S


def parked(now: float, low_cpu_since: float | None, worked: bool) -> bool:
    """Idle CPU for STUCK_MIN_S after it was seen at work, whatever its log says (issue 32): a side
    thread's counter keeps a log "advancing" while the main thread sits in a collective, and a job
    that logs every 100 steps says nothing for minutes; the monitor's own clock needs the stacks.
    Only its stacks (and the file it is blocked on) are taken for that: the costlier evidence (NCCL's
    RAS, Flight Recorder, sockets) waits for ``looks_stuck``."""
    return worked and low_cpu_since is not None and now - low_cpu_since >= STUCK_MIN_S


@dataclass
class DumpPlan:
    """Per-rank memory of dumps, for the policy."""

    discovered_at: float
    last_dump_at: float | None = None
    last_native_at: float | None = None
    stuck_since: float | None = None  # start of the current stuck episode
    # After dumps that timed out (py-spy held the rank stopped all the while): no dump until
    # quiet_until, and Python-only dumps (far cheaper than native unwinding) until native_off_until.
    timeouts: int = 0
    quiet_until: float | None = None
    native_off_until: float | None = None


def after_timeout(plan: DumpPlan, now: float, native: bool) -> None:
    """A dump of the rank timed out: each one in a row doubles the pause before the next (a rank
    py-spy cannot read in time was held stopped for the whole timeout, and would be again at every
    tick), and a native one turns native dumps off for a while."""
    plan.timeouts += 1
    plan.quiet_until = now + min(TIMEOUT_QUIET_MAX_S, DUMP_TIMEOUT_S * 2 ** (plan.timeouts - 1))
    if native:
        plan.native_off_until = now + NATIVE_OFF_AFTER_TIMEOUT_S


def next_dump(now: float, plan: DumpPlan, stuck: bool, python_only: bool = False) -> str | None:
    """"python", "native" or None: which dump this rank needs now. Updates the episode.
    ``python_only``: a stuck episode of Python dumps (a rank at work whose peers are parked: where
    it works is the question, and a native dump would hold it stopped for most of a second)."""
    if plan.quiet_until is not None and now < plan.quiet_until:
        return None
    off = python_only or (plan.native_off_until is not None and now < plan.native_off_until)
    native = "python" if off else "native"
    if not stuck:
        plan.stuck_since = None
        due = (
            plan.discovered_at + FIRST_DUMP_AFTER_S
            if plan.last_dump_at is None
            else plan.last_dump_at + BACKGROUND_DUMP_EVERY_S
        )
        return "python" if now >= due else None
    if plan.stuck_since is None:
        plan.stuck_since = now
        return native
    # Stuck ranks get native dumps: an async Work.wait or DDP's reducer shows only in native
    # frames, and the monitor keeps just the newest stack. In between, Python dumps check that the
    # rank is still where its native dump was (StackSampler._dump).
    if plan.last_dump_at is None or now - plan.last_dump_at >= STUCK_DUMP_EVERY_S:
        if plan.last_native_at is None or now - plan.last_native_at >= NATIVE_REFRESH_S:
            return native
        return "python"
    return None


def _python_frames(thread: dict) -> list[tuple]:
    return [(f.get("name"), f.get("file"), f.get("line")) for f in thread.get("frames") or [] if not f.get("native")]


def still_there(native: dict, python: dict) -> dict | None:
    """The native dump re-dated to ``python``'s time when the Python dump shows the main thread
    where the native one did (the same Python frames, idle or running alike): the native frames
    below them cannot have changed without the Python ones moving on. None when the rank moved."""
    native_threads, python_threads = native.get("threads") or [], python.get("threads") or []
    if not native_threads or not python_threads:
        return None
    then, now = native_threads[0], python_threads[0]
    if then.get("tid") != now.get("tid") or then.get("active") != now.get("active"):
        return None
    before, after = _python_frames(then), _python_frames(now)
    if len(then.get("frames") or []) >= MAX_FRAMES:
        # The native dump was cut at MAX_FRAMES, its native frames taking room: it holds the
        # innermost Python frames only.
        after = after[:len(before)]
    if before != after:
        return None
    return {**native, "taken_at": python["taken_at"], "duration_s": python.get("duration_s")}


class StackSampler:
    """Runs dumps on a small pool (bounded py-spy concurrency); keeps the latest per rank."""

    def __init__(
        self, py_spy: str | None, proc_root: str = "/proc", workers: int = 2, dumper: Dumper | None = None,
        worker_server: Callable[[int], Any] | None = None, clock: Callable[[], float] = time.time,
    ):
        self.py_spy = py_spy
        # The caller's clock: schedule() is given its time, and a timeout's pause is set on it too.
        self.clock = clock
        # A rank's torch worker server (agent/torch_worker_server.py): its stacks without ptrace,
        # where py-spy is missing, not permitted, or fails on the rank.
        self.worker_server = worker_server
        self.proc_root = proc_root
        self.dumper = dumper or Dumper.current()
        self.status = check_py_spy(py_spy)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="py-spy")
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self._stacks: dict[int, dict] = {}
        self._errors: dict[int, str] = {}
        self._plans: dict[int, DumpPlan] = {}
        self.recent_failures = 0  # consecutive failed dumps, for collector health

    def schedule(self, pid: int, now: float, stuck: bool, state: str | None, python_only: bool = False) -> None:
        plan = self._plans.setdefault(pid, DumpPlan(discovered_at=now))
        if self.status != "ok" and self.worker_server is None:
            with self._lock:
                self._errors[pid] = self.status
            return
        if state in STOPPED_STATES:
            return  # never ptrace a stopped rank or a zombie
        with self._lock:
            if pid in self._busy:
                return
        kind = next_dump(now, plan, stuck, python_only)
        if kind is None:
            return
        plan.last_dump_at = now
        if kind == "native":
            plan.last_native_at = now
        with self._lock:
            self._busy.add(pid)
        self._pool.submit(self._dump, pid, kind == "native")

    def request(self, pid: int, native: bool = False) -> bool:
        """An asynchronous dump outside the rank policy (launchers); False when not started."""
        if self.status != "ok":
            with self._lock:
                self._errors[pid] = self.status
            return False
        with self._lock:
            if pid in self._busy:
                return False
            self._busy.add(pid)
        self._pool.submit(self._dump, pid, native)
        return True

    def dump_now(self, pid: int, native: bool = False) -> None:
        """Synchronous dump (for --once)."""
        if self.status != "ok" and self.worker_server is None:
            with self._lock:
                self._errors[pid] = self.status
            return
        self._dump(pid, native)

    def _dump(self, pid: int, native: bool) -> None:
        try:
            stack = self._take(pid, native)
            if stack is None:
                return
        except (StackError, OSError, ValueError) as e:
            with self._lock:
                self._errors[pid] = str(e)[:2048]
                self.recent_failures += 1
                plan = self._plans.get(pid)
                if plan is not None and isinstance(e, StackError) and e.reason == "timeout":
                    now = self.clock()
                    after_timeout(plan, now, native)
                    # Said in the log: the next Python dump clears the rank's error, and a stack
                    # without native frames would not say why.
                    kind, after = ("Python", "")
                    if native:
                        kind, after = "native", f", Python-only for {plan.native_off_until - now:.0f} s"
                    log.info("pid %d: %s dump: %s; next dump in %.0f s%s", pid, kind, e, plan.quiet_until - now, after)
                elif plan is not None and native:
                    plan.last_native_at = None  # no native frames to carry forward: try again next tick
        else:
            with self._lock:
                plan = self._plans.get(pid)
                previous = self._stacks.get(pid)
                carry = (not native and plan is not None and plan.stuck_since is not None and previous
                         and previous.get("native") and plan.last_native_at is not None
                         and self.clock() - plan.last_native_at <= NATIVE_CARRY_MAX_S)
                if carry:
                    carried = still_there(previous, stack)
                    if carried is None:
                        plan.last_native_at = None  # it moved: the next dump is native
                    else:
                        stack = carried
                self._stacks[pid] = stack
                self._errors.pop(pid, None)
                self.recent_failures = 0
                if plan is not None:
                    plan.timeouts = 0
        finally:
            with self._lock:
                self._busy.discard(pid)

    def _take(self, pid: int, native: bool, capture: bool = False) -> dict | None:
        """py-spy's dump of the rank, else its worker server's; None when the rules said no.
        A ``capture`` (once, on request) waits for another tracer to let go of the rank; a periodic
        dump that meets one tries once more after a short random pause instead of holding a worker."""
        py_spy_failed: StackError | None = None
        if self.status == "ok":
            refusal = dump_refusal(read_target(self.proc_root, pid), self.dumper)
            if refusal is None:
                try:
                    return take_stack(self.py_spy, self.proc_root, pid, native,
                                      traced_wait_s=TRACED_WAIT_S if capture else 0.0)
                except StackError as e:
                    py_spy_failed = e
                if not capture and contended(py_spy_failed):
                    time.sleep(random.uniform(*CONTENDED_RETRY_S))
                    try:
                        return take_stack(self.py_spy, self.proc_root, pid, native, traced_wait_s=TRACED_WAIT_S)
                    except StackError as e:
                        py_spy_failed = e
        server = self.worker_server(pid) if self.worker_server is not None else None
        if server is None:
            if py_spy_failed is not None:
                raise py_spy_failed
            if self.status == "ok":
                with self._lock:
                    self._errors[pid] = refusal  # the rules said no: not a failed dump
                return None
            raise StackError(self.status, "unavailable")
        return server.stack()

    def take_now(self, pid: int, native: bool = True, wait_s: float = BUSY_WAIT_S) -> dict:
        """One dump now, on the caller's thread (an evidence capture), after any dump of the rank
        under way (two py-spy on one process: the second finds it traced, state "t");
        raises StackError saying why not."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                if pid not in self._busy:
                    self._busy.add(pid)
                    break
            if time.monotonic() >= deadline:
                raise StackError(f"another dump of pid {pid} took over {wait_s:.0f}s")
            time.sleep(0.05)
        try:
            stack = self._take(pid, native, capture=True)
        finally:
            with self._lock:
                self._busy.discard(pid)
        if stack is None:
            with self._lock:
                raise StackError(self._errors.get(pid) or "not dumped")
        return stack

    def latest(self, pid: int) -> tuple[dict | None, str | None]:
        with self._lock:
            return self._stacks.get(pid), self._errors.get(pid)

    def forget(self, pid: int) -> None:
        with self._lock:
            self._stacks.pop(pid, None)
            self._errors.pop(pid, None)
            self._plans.pop(pid, None)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
