"""An evidence capture as the agent takes it (agent/capture.py): tails, untracked pids, errors said."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from pathlib import Path

from agent.capture import Capturer, log_tails, tail
from agent.stacks import StackError


def test_a_tail_starts_at_a_line(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    log.write_text("".join(f"line {i}\n" for i in range(10_000)))
    text = tail(str(log), limit=100)
    assert text.endswith("line 9999\n") and text.startswith("line ") and len(text) <= 100
    log.write_text("short\n")
    assert tail(str(log)) == "short\n"


def test_a_live_ranks_stdout_is_read_through_proc(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", "print('rank says hi', flush=True); import time; time.sleep(30)"],
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "hi\n" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        tails = log_tails("/proc", proc.pid, [str(out)])
        assert tails == {str(out): "rank says hi\n"}  # one file, read once though named twice
    finally:
        proc.kill()
        proc.wait()


def test_only_tracked_ranks_are_captured_and_failures_are_said() -> None:
    def failing_stack(pid: int) -> dict:
        raise StackError("py-spy failed: Permission denied")

    capturer = Capturer("/proc", lambda pid: {"rank": 1, "pid": pid, "alive": True} if pid == 11 else None,
                        failing_stack, lambda pid: None, lambda pid: [], lambda: {"status": "no listener"}, "node-a")
    part = capturer.capture({"bundle": "b", "job_id": "j", "pids": [11, 12, "13"], "upload": "/x"})
    assert [r["pid"] for r in part["ranks"]] == [11]
    assert part["ranks"][0]["errors"] == {"stack": "py-spy failed: Permission denied"}
    assert part["node"] == "node-a" and part["nccl_ras"] == {"status": "no listener"}


def test_a_log_known_by_name_is_not_followed_through_a_symlink(tmp_path: Path) -> None:
    """A log the follower knew by name, swapped for a link to another file (the rank's user owns
    the log's folder; the agent is often root): its tail is not taken."""
    secret = tmp_path / "secret"
    secret.write_text("not for the bundle\n")
    log = tmp_path / "train.log"
    log.symlink_to(secret)
    assert log_tails("/proc", 2**22 + 1, [str(log)]) == {}
    with pytest.raises(OSError):
        tail(str(log), follow=False)
    assert tail(str(log)) == "not for the bundle\n"  # the magic links of /proc/PID/fd are followed
