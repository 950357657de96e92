"""py-spy JSON parsing (real recorded dumps) and the dump policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.stacks import (
    stop_pending,
    DumpPlan,
    StackError,
    after_timeout,
    contended,
    looks_stuck,
    parked,
    MAX_FRAMES,
    next_dump,
    still_there,
    one_line,
    parse_dump,
    usual_step_interval,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "agent"


def test_parse_real_dump_main_thread_first():
    text = (FIXTURES / "pyspy_dump.json").read_text()
    pid = json.loads(text)[0]["pid"]
    threads = parse_dump(text, pid)
    assert [t["name"] for t in threads] == ["MainThread", "sleeper"]
    assert threads[0]["tid"] == pid
    assert threads[0]["frames"] == [{"name": "<module>", "file": "/tmp/spin.py", "line": 14, "native": False}]
    # innermost first, as py-spy prints them
    assert [f["name"] for f in threads[1]["frames"]][:2] == ["worker", "Thread.run"]


def test_parse_real_native_dump():
    text = (FIXTURES / "pyspy_dump_native.json").read_text()
    threads = parse_dump(text, json.loads(text)[0]["pid"])
    main = threads[0]["frames"]
    assert main[0] == {
        "name": "clock_nanosleep", "file": "/usr/lib/x86_64-linux-gnu/libc.so.6", "line": None, "native": True,
    }
    assert {"name": "<module>", "file": "/tmp/spin.py", "line": 14, "native": False} in main


def test_parse_caps_threads_and_frames():
    raw = [
        {"os_thread_id": i, "thread_name": f"t{i}", "frames": [{"name": f"f{j}", "filename": "x.py", "line": j} for j in range(100)]}
        for i in range(1, 30)
    ]
    threads = parse_dump(json.dumps(raw), pid=7, max_threads=16, max_frames=64)
    assert len(threads) == 16 and all(len(t["frames"]) == 64 for t in threads)


def test_parse_rejects_non_list():
    with pytest.raises(StackError):
        parse_dump('{"error": 1}', pid=1)


def test_usual_step_interval():
    assert usual_step_interval([]) is None
    assert usual_step_interval([(10.0, 1), (10.0, 2)]) is None
    assert usual_step_interval([(10.0, 1), (12.0, 2), (14.0, 3)]) == 2.0


@pytest.mark.parametrize(
    "now, progress, low_cpu_since, stuck",
    [
        (100.0, {"step_at": 99.0, "recent": []}, None, False),
        (100.0, {"step_at": 98.5, "recent": []}, None, False),  # 1.5 s < 2 s
        (100.0, {"step_at": 97.5, "recent": []}, None, True),  # 2.5 s > 2 s
        # slow steps (10 s each): 20 s without progress is still normal
        (100.0, {"step_at": 80.0, "recent": [(50.0, 1), (60.0, 2), (70.0, 3), (80.0, 4)]}, None, False),
        (100.0, {"step_at": 60.0, "recent": [(30.0, 1), (40.0, 2), (50.0, 3), (60.0, 4)]}, None, True),
        (100.0, None, 98.5, False),
        (100.0, None, 97.5, True),
        (100.0, None, None, False),
    ],
)
def test_looks_stuck(now, progress, low_cpu_since, stuck):
    assert looks_stuck(now, progress, low_cpu_since) is stuck


@pytest.mark.parametrize(
    "low_cpu_since, worked, is_parked",
    [
        (97.5, True, True),  # idle 2.5 s after work: its stacks are taken, whatever its log says
        (98.5, True, False),  # idle 1.5 s
        (97.5, False, False),  # never seen at work (a light job): nothing to time
        (None, True, False),
    ],
)
def test_parked(low_cpu_since, worked, is_parked):
    """A log that keeps advancing (a side thread's counter) or that prints every 100th step does not
    keep an idle rank's stacks from being taken (issue 32)."""
    assert parked(100.0, low_cpu_since, worked) is is_parked


def test_a_python_only_episode_never_holds_the_rank_for_a_native_dump():
    """A rank at work beside parked peers (issue 32): its stacks every 3 s, Python ones only."""
    plan = DumpPlan(discovered_at=0.0)
    kinds = []
    for t in (10.0, 11.0, 13.0, 16.0, 50.0):
        kind = next_dump(t, plan, stuck=True, python_only=True)
        if kind is not None:
            plan.last_dump_at = t  # as StackSampler.schedule does
        kinds.append(kind)
    assert kinds == ["python", None, "python", "python", "python"]
    assert next_dump(53.0, plan, stuck=True) == "native"  # parked itself now: its native frames


def test_dump_schedule_background_then_stuck_episode():
    plan = DumpPlan(discovered_at=0.0)
    assert next_dump(1.0, plan, stuck=False) is None
    assert next_dump(2.0, plan, stuck=False) == "python"  # first dump ~2 s after discovery
    plan.last_dump_at = 2.0
    assert next_dump(10.0, plan, stuck=False) is None
    assert next_dump(22.0, plan, stuck=False) == "python"  # every 20 s
    plan.last_dump_at = 22.0
    # stuck: a native dump at once, then a Python one every 3 s, a native one every 30 s
    assert next_dump(23.0, plan, stuck=True) == "native"
    plan.last_dump_at = plan.last_native_at = 23.0
    assert next_dump(24.0, plan, stuck=True) is None
    assert next_dump(26.0, plan, stuck=True) == "python"
    plan.last_dump_at = 50.0
    assert next_dump(53.0, plan, stuck=True) == "native"
    plan.last_dump_at, plan.last_native_at = 56.0, None  # a Python dump saw it move: native at once
    assert next_dump(59.0, plan, stuck=True) == "native"
    plan.last_dump_at = plan.last_native_at = 53.5
    # episode ends, and a new one gets its own native dump at once
    assert next_dump(54.0, plan, stuck=False) is None
    assert next_dump(55.0, plan, stuck=True) == "native"


def _dump(taken_at: float, *frames: tuple[str, int, bool], active: bool = False) -> dict:
    return {"taken_at": taken_at, "native": any(native for _, _, native in frames), "duration_s": 0.01,
            "threads": [{"tid": 7, "name": "MainThread", "active": active, "owns_gil": False,
                         "frames": [{"name": n, "file": "" if native else "train.py", "line": None if native else line,
                                     "native": native} for n, line, native in frames]}]}


WAITING = (("c10d::ProcessGroupGloo::AsyncWork::wait", 0, True), ("all_reduce", 161, False), ("train", 384, False))


@pytest.mark.parametrize(("python", "carried"), [
    (_dump(13.0, ("all_reduce", 161, False), ("train", 384, False)), True),  # where it was: native kept
    (_dump(13.0, ("all_reduce", 170, False), ("train", 384, False)), False),  # another line
    (_dump(13.0, ("train", 384, False)), False),  # left the collective
    (_dump(13.0, ("all_reduce", 161, False), ("train", 384, False), active=True), False),  # running now
    ({"taken_at": 13.0, "threads": []}, False),
])
def test_a_python_dump_carries_the_native_one_forward_only_where_the_rank_still_is(python: dict, carried: bool) -> None:
    native = _dump(10.0, *WAITING)
    got = still_there(native, python)
    if carried:
        assert got == {**native, "taken_at": 13.0, "duration_s": 0.01}  # native frames, the new time
    else:
        assert got is None


def test_dumps_that_time_out_pause_and_go_python_only():
    """A dump that timed out held the rank stopped for the whole timeout: the next waits 5 s, then
    10, 20, ... up to 60; after a native one, dumps are Python-only for a minute; a dump that ends
    well starts the count over."""
    plan = DumpPlan(discovered_at=0.0, stuck_since=10.0, last_dump_at=10.0, last_native_at=10.0)
    after_timeout(plan, 15.0, native=True)
    assert next_dump(19.0, plan, stuck=True) is None  # quiet until 20
    assert next_dump(20.0, plan, stuck=True) == "python"
    plan.last_dump_at = 20.0
    after_timeout(plan, 25.0, native=False)
    assert plan.quiet_until == 35.0 and next_dump(34.0, plan, stuck=True) is None
    assert next_dump(35.0, plan, stuck=True) == "python"
    for _ in range(5):
        after_timeout(plan, 100.0, native=False)
    assert plan.quiet_until == 160.0  # capped at a minute
    plan.timeouts = 0  # a dump ended well
    plan.last_dump_at = 160.0
    assert next_dump(170.0, plan, stuck=True) == "native"  # native dumps are back after their minute


STATUS = "Name:\tpython\nState:\tR (running)\nSigQ:\t0/95\nSigPnd:\t{own}\nShdPnd:\t{shared}\nSigBlk:\t0000000000000000\n"


@pytest.mark.parametrize("own, shared, pending", [
    ("0000000000000000", "0000000000000000", False),
    ("0000000000000000", "0000000000040000", True),    # SIGSTOP (19) sent to the process, not yet taken
    ("0000000000040000", "0000000000000000", True),    # ... to its main thread
    ("0000000000000000", "0000000000010000", False),   # SIGCHLD (17) alone
    ("0000000000000000", "0000000000000100", False),   # SIGKILL (9): not a stop
    ("0000000000000000", "not-hex", False),
])
def test_a_pending_stop_is_read_from_proc_status(own, shared, pending):
    assert stop_pending(STATUS.format(own=own, shared=shared)) is pending


@pytest.mark.parametrize(("output", "said"), [
    ("Error: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow::msg\n  10: main\n",
     "Error: Failed to find python version from target process"),
    ("Permission denied (os error 13)\n", "Permission denied (os error 13)"),
    ("", "no output"),
])
def test_py_spys_failure_is_its_error_line_not_its_backtrace(output: str, said: str) -> None:
    assert one_line(output) == said


@pytest.mark.parametrize(("reason", "again"), [
    ("failed", True),  # py-spy could not read the rank: attached to by another tracer
    ("traced", True),  # in another tracer's ptrace stop
    ("stopped", False),  # someone's SIGSTOP: evidence, never dumped
    ("timeout", False),  # py-spy held the rank the whole time: the back-off's case, not a retry's
    ("killed", False),
    ("unavailable", False),
    ("other", False),
])
def test_which_failed_dumps_are_tried_again(reason: str, again: bool) -> None:
    assert contended(StackError("why", reason)) is again


def test_a_native_dump_cut_at_the_frame_limit_is_matched_on_the_python_frames_it_kept() -> None:
    """Native frames take room in a deep stack: a dump cut at MAX_FRAMES holds only the innermost
    Python frames, which the Python dump must start with."""
    natives = [(f"native_{i}", 0, True) for i in range(MAX_FRAMES - 2)]
    native = _dump(10.0, natives[0], ("all_reduce", 161, False), *natives[1:], ("train_step", 90, False))
    deep = [("all_reduce", 161, False), ("train_step", 90, False), ("fit", 40, False), ("main", 9, False)]
    assert still_there(native, _dump(13.0, *deep)) is not None
    assert still_there(native, _dump(13.0, ("all_reduce", 161, False), ("eval_step", 70, False), *deep[2:])) is None
