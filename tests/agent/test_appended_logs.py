"""A rank's own log file (one it holds open for appending) is followed without --log: the rule,
then real processes that log the way training code does, next to files that are not logs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.appended_files import AppendedFiles, is_appended_log
from agent.identity import RankIdentity
from agent.logs import LogFollower
from agent.discovery import RankProcess
from agent.procstat import O_APPEND, O_RDWR, O_WRONLY

O_CREAT, O_TRUNC, O_RDONLY = 0o100, 0o1000, 0o0


@pytest.mark.parametrize(("flags", "target", "followed"), [
    (O_WRONLY | O_APPEND | O_CREAT, "/run/job/train.log", True),  # logging.FileHandler, open(p, "a")
    (O_RDWR | O_APPEND, "/run/job/train.log", True),  # open(p, "a+")
    (O_WRONLY | O_CREAT | O_TRUNC, "/run/job/ckpt.pt", False),  # open(p, "wb"): torch.save, a checkpoint
    (O_RDONLY | O_APPEND, "/run/job/train.log", False),  # read only
    (O_WRONLY | O_APPEND, "pipe:[1234]", False),
    (O_WRONLY | O_APPEND, "socket:[99]", False),
    (O_WRONLY | O_APPEND, "/dev/null", False),
    (O_WRONLY | O_APPEND, "/proc/self/fd/1", False),
    (O_WRONLY | O_APPEND, "/run/job/train.log (deleted)", False),
])
def test_which_open_files_are_a_ranks_own_log(flags: int, target: str, followed: bool) -> None:
    assert is_appended_log(flags, target) is followed


# A "rank" as training code writes: progress through logging.FileHandler (appending), a
# checkpoint written "wb", a binary file appended to, and stdout not a file at all.
RANK = textwrap.dedent(
    """
    import logging, os, sys, time
    log_path, ckpt_path, binary_path = sys.argv[1:4]
    handler = logging.FileHandler(log_path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s INFO %(message)s"))
    log = logging.getLogger("train")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    ckpt = open(ckpt_path, "wb")
    binary = open(binary_path, "ab")
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        log.info("step %d/1000 | loss 0.25", step)
        ckpt.write(b"step %d/1000\\n" % step); ckpt.flush()  # looks like progress: must not count
        binary.write(b"\\0\\1step %d/1000\\n" % step); binary.flush()
        time.sleep(0.1)
    """
)


@pytest.fixture
def rank_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    log_path = tmp_path / "train.log"
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(log_path), str(tmp_path / "ckpt.pt"),
                             str(tmp_path / "events.bin")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline() == b"ready\n"
        yield proc, log_path
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def _rank(pid: int) -> RankProcess:
    return RankProcess(pid, os.getpid(), 1, RankIdentity("job-a", 0, 2, 0, "torchrun"), "python train.py")


def test_a_ranks_own_log_file_is_found_by_how_it_is_open(rank_process) -> None:
    proc, log_path = rank_process
    found = AppendedFiles().of(proc.pid, now=0.0)
    assert [path for _, path in found] == [str(log_path), str(log_path.parent / "events.bin")]


def test_progress_comes_from_a_ranks_own_log_file_and_not_from_its_other_files(rank_process) -> None:
    proc, log_path = rank_process
    follower = LogFollower()
    rank = _rank(proc.pid)
    deadline = time.monotonic() + 15
    steps: list[int] = []
    try:
        while time.monotonic() < deadline:
            follower.collect([rank], time.time())
            progress = follower.progress_of(proc.pid)
            if progress is not None and progress["step"] is not None:
                steps.append(progress["step"])
            if len(set(steps)) >= 3:
                break
            time.sleep(0.3)
        assert len(set(steps)) >= 3 and steps == sorted(steps), steps  # the rank is seen stepping
        progress = follower.progress_of(proc.pid)
        assert progress["source"] == str(log_path) and progress["scope"] == "rank", progress
        # The binary file was read, found not to be text and dropped (not a log to capture either).
        assert follower.files_of(proc.pid) == [str(log_path)]  # not the binary one, nor the checkpoint
        binary = next(e.tailer for e in follower._files.values() if e.tailer.path.endswith("events.bin"))
        assert binary.binary
    finally:
        follower.close()


LATE_OPENER = textwrap.dedent(
    """
    import sys
    sys.stdin.readline()  # the agent has looked once already
    log = open(sys.argv[1], "a")
    print("opened", flush=True)
    sys.stdin.readline()
    """
)


def test_a_log_opened_after_the_rank_was_found_is_seen_within_a_second(tmp_path: Path) -> None:
    """Code opens its log when training starts, after the agent found the rank at import: a young
    rank's fds are listed again every second, an older one's every 10 s."""
    log_path = tmp_path / "late.log"
    proc = subprocess.Popen([sys.executable, "-c", LATE_OPENER, str(log_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        files = AppendedFiles()
        assert files.of(proc.pid, now=100.0) == ()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"opened\n"
        assert files.of(proc.pid, now=100.5) == ()  # listed half a second ago
        assert [path for _, path in files.of(proc.pid, now=101.0)] == [str(log_path)]
        files.forget(proc.pid)
        assert files.of(proc.pid, now=200.0) != ()
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


REOPENER = textwrap.dedent(
    """
    import sys
    log = open(sys.argv[1], "a")
    log.write("step 1/100\\n"); log.flush()
    print("logged", flush=True)
    sys.stdin.readline()
    fd = log.fileno()
    log.close()
    data = open(sys.argv[2], "w")  # the same fd number, not a log
    assert data.fileno() == fd
    data.write("step 99/100\\n"); data.flush()
    print("reused", flush=True)
    sys.stdin.readline()
    """
)


def test_an_fd_reused_for_another_file_since_the_scan_is_not_read_as_the_log(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", REOPENER, str(tmp_path / "a.log"), str(tmp_path / "data.txt")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    follower = LogFollower()
    try:
        assert proc.stdout.readline() == b"logged\n"
        follower.appended.rescan_s = 3600.0  # the scan's answer stays cached
        follower.collect([_rank(proc.pid)], now=100.0)
        assert [path for _, path in follower.appended.of(proc.pid, 100.0)] == [str(tmp_path / "a.log")]
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"reused\n"
        follower.collect([_rank(proc.pid)], now=100.5)  # within a second: the cached scan is used
        progress = follower.progress_of(proc.pid)
        assert progress is None or progress["step"] != 99, progress
        assert str(tmp_path / "data.txt") not in follower.files_of(proc.pid)
    finally:
        follower.close()
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
