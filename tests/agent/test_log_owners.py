"""Which job a --log file's lines count for (issue 20): the rule as a table, then the follower on
real processes writing real files (a rank's own file, a launcher's, ``tee`` reading a pipe)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.discovery import RankIdentity, RankProcess
from agent.log_owners import RESOLVE_EVERY_S, LogSource, Tie, decide
from agent.logs import LogFollower
from hangwatch.demo.harness import MonitorClient, Reaper, free_port, start_agent, start_monitor

A, B = "127.0.0.1:29500", "127.0.0.1:29600"


@pytest.mark.parametrize(
    "text, source",
    [
        ("/var/log/train.log", LogSource("/var/log/train.log")),
        (f"{A}=/var/log/a.log", LogSource("/var/log/a.log", A)),
        ("slurm:123.0=out.log", LogSource("out.log", "slurm:123.0")),
        ("./x=1.log", LogSource("./x=1.log")),  # a path with "=" in it: a job id holds no "/"
        ("=a.log", LogSource("=a.log")),
        ("job=", LogSource("job=")),
    ],
)
def test_log_argument(text, source):
    assert LogSource.parse(text) == source


ONE, TWO = frozenset({A}), frozenset({A, B})
NO_JOB, OF_B = frozenset(), frozenset({B})


@pytest.mark.parametrize(
    "named, writers, node_jobs, job, how",
    [
        (None, {1: ONE}, TWO, A, "written by the job's processes"),
        (None, {1: ONE, 2: NO_JOB}, TWO, A, "written by the job's processes"),  # and a stray writer
        (None, {1: ONE, 2: OF_B}, TWO, None, "written by processes of 2 jobs"),
        (None, {1: NO_JOB}, ONE, None, "written only by processes of no job"),
        (None, {}, ONE, A, "nobody holds it open and one job runs"),
        (None, {}, TWO, None, "nobody holds it open and 2 jobs run on this node: name the job"),
        (None, {}, frozenset(), None, "no job runs"),
    ],
)
def test_which_job_a_file_counts_for(named, writers, node_jobs, job, how):
    tie = decide(named, writers, node_jobs)
    assert tie.job == job and tie.how.startswith(how), tie
    assert isinstance(tie, Tie)


@pytest.mark.parametrize(
    "writers, job, how",
    [
        ({}, A, "named on --log"),  # written by nobody: the operator's word, as before
        ({1: ONE}, A, "named on --log"),  # the job's rank, launcher or ancestor
        # A tee, or Slurm's batch shell and srun (not the ranks' ancestors): no other job's lines.
        ({1: ONE, 2: NO_JOB}, A, "named on --log"),
        ({2: NO_JOB}, A, "named on --log"),
        # Another job's process writes it too: its steps would show as A's progress.
        ({1: ONE, 7: OF_B}, None, f"named for job {A} on --log but also written by job {B} (pid 7)"),
        ({7: OF_B}, None, f"named for job {A} on --log but also written by job {B} (pid 7)"),
        # A shell that launched both jobs: its output may be B's.
        ({3: TWO}, None, f"named for job {A} on --log but also written by job {B} (pid 3)"),
        ({8: frozenset({"c"}), 7: OF_B, 1: ONE}, None,
         f"named for job {A} on --log but also written by jobs {B}, c (pids 7, 8)"),
    ],
)
def test_a_file_named_for_a_job_counts_for_it_unless_another_job_writes_it(writers, job, how):
    tie = decide(A, writers, TWO)
    assert tie == Tie(job, how)


def test_a_file_named_for_a_job_that_is_not_running_counts_for_none_once_another_job_writes_it():
    assert decide("gone", {}, ONE) == Tie("gone", "named on --log")
    assert decide("gone", {7: ONE}, ONE).job is None


def _rank(proc: subprocess.Popen | int, job: str, rank: int = 0, ppid: int = 1) -> RankProcess:
    pid = proc if isinstance(proc, int) else proc.pid
    return RankProcess(pid, ppid, 1, RankIdentity(job, rank, 2, rank, "torchrun"), "python train.py")


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class Processes:
    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, cmd, **kwargs) -> subprocess.Popen:
        p = subprocess.Popen(cmd, **kwargs)
        self.started.append(p)
        return p

    def holding(self, path: Path, **kwargs) -> subprocess.Popen:
        """A process that holds ``path`` open for appending (as a logging.FileHandler does) on fd 3+."""
        code = f"import time; f = open({str(path)!r}, 'a'); print('ready', flush=True); time.sleep(120)"
        p = self.start([sys.executable, "-c", code], stdout=subprocess.PIPE, **kwargs)
        assert p.stdout.readline() == b"ready\n"
        return p


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        for p in procs.started:
            p.kill()
            p.wait()
            if p.stdout:
                p.stdout.close()


def _step(follower: LogFollower, pid: int) -> int | None:
    progress = follower.progress_of(pid)
    return progress["step"] if progress else None


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


@pytest.mark.live  # real processes
def test_two_jobs_on_one_node_each_log_counts_for_its_own_job(tmp_path, processes):
    """Job A's output goes through ``tee a.log``; job B's rank writes b.log itself; c.log is its
    launcher's (the rank's parent holds it); d.log is written by ranks of both jobs, e.log is
    named for job B, and f.log nobody holds: each --log counts for its own job, or for none."""
    a_log, b_log, c_log, d_log, e_log, f_log = (tmp_path / f"{n}.log" for n in "abcdef")
    for path in (a_log, b_log, c_log, d_log, e_log, f_log):
        path.write_text("")
    rank_a = processes.start(SLEEPER, stdout=subprocess.PIPE)
    # tee's stdin: the pipe rank A (and, in life, torchrun) writes to.
    processes.start(["tee", "-a", str(a_log)], stdin=rank_a.stdout, stdout=subprocess.DEVNULL)
    rank_b = processes.holding(b_log)
    launcher = processes.holding(c_log)
    rank_b2 = processes.start(SLEEPER, stdout=subprocess.DEVNULL)
    writer_a = processes.holding(d_log)
    writer_b = processes.holding(d_log)
    ranks = [_rank(rank_a, A), _rank(writer_a, A, rank=1),
             _rank(rank_b, B), _rank(rank_b2, B, rank=1, ppid=launcher.pid), _rank(writer_b, B, rank=2)]
    follower = LogFollower(extra_paths=(str(a_log), str(b_log), str(c_log), str(d_log), f"{B}={e_log}", str(f_log)))
    follower.collect(ranks, now=1.0)
    # tee copies what it reads from the rank's stdout pipe; the test writes into the same pipe.
    subprocess.run(["sh", "-c", f"echo 'step 11' > /proc/{rank_a.pid}/fd/1"], check=True)
    _append(b_log, "step 22\n")
    _append(c_log, "[default1]:step 33\n")
    _append(d_log, "step 44\n")
    _append(e_log, "step 55\n")
    _append(f_log, "step 66\n")
    deadline = time.monotonic() + 10
    while "step 11" not in a_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    follower.collect(ranks, now=2.0)
    try:
        # Through tee's pipe: job A's (both its ranks: an unprefixed line is the job's), nothing else:
        # not B's lines, not d.log's (written by both jobs), not f.log's (nobody's, two jobs here).
        assert follower.progress_of(rank_a.pid)["recent"] == [(2.0, 11)]
        assert follower.progress_of(writer_a.pid)["recent"] == [(2.0, 11)]
        # b.log (held by a rank of B) and e.log (named for B) are B's; c.log, held by rank 1's
        # parent, is B's too, and its prefixed line is rank 1's own.
        assert follower.progress_of(rank_b.pid)["recent"] == [(2.0, 22), (2.0, 55)]
        own = follower.progress_of(rank_b2.pid)
        assert (own["scope"], own["step"], own["source"]) == ("rank", 33, str(c_log))
        assert str(a_log) in follower.files_of(rank_a.pid) and str(b_log) not in follower.files_of(rank_a.pid)
    finally:
        follower.close()


@pytest.mark.live
def test_a_log_nobody_holds_counts_for_the_only_job_and_for_none_beside_a_second(tmp_path, processes):
    log = tmp_path / "train.log"
    log.write_text("")
    rank_a, rank_b = (processes.start(SLEEPER, stdout=subprocess.DEVNULL) for _ in range(2))
    follower = LogFollower(extra_paths=(str(log),))
    follower.collect([_rank(rank_a, A)], now=1.0)
    _append(log, "step 5\n")
    follower.collect([_rank(rank_a, A)], now=2.0)
    assert _step(follower, rank_a.pid) == 5
    both = [_rank(rank_a, A), _rank(rank_b, B)]  # a second job starts: the file is tied anew at once
    follower.collect(both, now=3.0)
    _append(log, "step 6\n")
    follower.collect(both, now=4.0)
    assert _step(follower, rank_a.pid) == 5 and _step(follower, rank_b.pid) is None
    follower.close()


@pytest.mark.live
def test_a_file_named_for_a_job_that_another_jobs_rank_writes_counts_for_none_said_once(tmp_path, processes,
                                                                                       caplog):
    """Job A is named by its Slurm job id: own.log, held by A's rank, counts for A; shared.log, named for
    A but held by a rank of job B too, counts for none, with one warning naming B and its pid."""
    own_log, shared_log = tmp_path / "own.log", tmp_path / "shared.log"
    for path in (own_log, shared_log):
        path.write_text("")
    rank_a = processes.holding(own_log)
    shared_a = processes.holding(shared_log)
    writer_b = processes.holding(shared_log)
    slurm = {"SLURM_JOB_ID": "123"}
    ranks = [RankProcess(rank_a.pid, 1, 1, RankIdentity(A, 0, 2, 0, "env"), "python train.py", slurm),
             RankProcess(shared_a.pid, 1, 1, RankIdentity(A, 1, 2, 1, "env"), "python train.py", slurm),
             _rank(writer_b, B)]
    follower = LogFollower(extra_paths=(f"123={own_log}", f"123={shared_log}"))
    with caplog.at_level(logging.INFO, logger="agent"):
        follower.collect(ranks, now=1.0)
        _append(own_log, "step 7\n")
        _append(shared_log, "step 99\n")
        for now in (2.0, 3.0, 2.0 + RESOLVE_EVERY_S):  # looked up again, the same tie: not said again
            follower.collect(ranks, now=now)
    try:
        assert follower.progress_of(rank_a.pid)["recent"] == [(2.0, 7)]
        assert _step(follower, shared_a.pid) == 7 and _step(follower, writer_b.pid) is None
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [f"log {shared_log}: credited to no job: named for job 123 on --log but also written "
                            f"by job {B} (pid {writer_b.pid})"], caplog.text
        assert f"log {own_log}: credited to job 123 (named on --log)" in caplog.text
    finally:
        follower.close()


# A rank of job B that writes its steps both to its own stdout and to the file named for job A.
STEPPING_RANK = """
import sys, time
shared = open(sys.argv[1], "a", buffering=1)
step = 0
while True:
    step += 1
    shared.write(f"step {step}\\n")
    print(f"step {step}", flush=True)
    time.sleep(0.1)
"""


def _job_env(port: int) -> dict[str, str]:
    """What makes a Python process a rank of the job 127.0.0.1:PORT to the agent's discovery."""
    return {"PATH": os.environ.get("PATH", ""), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _steps_by_job(answer: dict) -> dict[str, list[int | None]]:
    return {job["job_id"]: [r["step"] for r in job["ranks"]] for job in answer.get("jobs", [])}


@pytest.mark.live
@pytest.mark.timeout(90)
def test_the_real_agent_credits_a_named_log_another_job_writes_to_no_job(tmp_path):
    """Issue 33: ``--log A=shared.log`` while job B's rank writes its steps there. Before, the monitor
    showed B's steps as A's progress (A idle, "healthy"); now A shows none, and the agent's log names
    B and the pid that writes the file."""
    shared_log, a_out, b_out = tmp_path / "shared.log", tmp_path / "a.out", tmp_path / "b.out"
    shared_log.write_text("")
    port_a, port_b = free_port(), free_port()
    job_a, job_b = f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"
    with Reaper() as reaper:
        with open(a_out, "wb") as out:  # job A: an idle rank that prints nothing
            reaper.popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=out, env=_job_env(port_a))
        with open(b_out, "wb") as out:
            rank_b = reaper.popen([sys.executable, "-c", STEPPING_RANK, str(shared_log)], stdout=out,
                                  env=_job_env(port_b))
        _wait_until(lambda: "step 1" in shared_log.read_text(), 20, lambda: "job B wrote nothing")
        monitor = start_monitor(reaper, tmp_path)
        agent = start_agent(reaper, tmp_path, monitor.url, interval=0.5, extra=[
            "--job", job_a, "--job", job_b, "--no-stacks", "--no-nccl-ras", "--log", f"{job_a}={shared_log}"])
        client = MonitorClient(monitor.url)
        try:
            # B's steps come from its stdout, read in the same tick as shared.log: once the monitor
            # shows them beside A's rank, shared.log's lines were read too, and none went to A.
            seen: dict[str, list[int | None]] = {}

            def a_shows_none_beside_bs_steps() -> bool:
                seen.update(_steps_by_job(client.diagnose()))
                assert not any(seen.get(job_a, [])), f"job A shows job B's steps: {seen}"
                return job_a in seen and any(seen.get(job_b, []))

            _wait_until(a_shows_none_beside_bs_steps, 45, lambda: f"{seen}\nagent:\n{agent.log_tail(20)}")
            warning = (f"log {shared_log}: credited to no job: named for job {job_a} on --log "
                       f"but also written by job {job_b} (pid {rank_b.pid})")
            _wait_until(lambda: warning in agent.log_tail(200), 10, lambda: agent.log_tail(20))
            [line] = [line for line in agent.log_tail(200).splitlines() if warning in line]
            assert " WARNING " in line, line
            assert a_shows_none_beside_bs_steps()
        finally:
            client.close()


def _wait_until(condition, timeout: float, context) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not so in {timeout}s: {context()}")
        time.sleep(0.2)
