"""Which job a --log file's lines count for (issue 20): the rule as a table, then the follower on
real processes writing real files (a rank's own file, a launcher's, ``tee`` reading a pipe)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.discovery import RankIdentity, RankProcess
from agent.log_owners import LogSource, Tie, decide
from agent.logs import LogFollower

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


@pytest.mark.parametrize(
    "named, writers, node_jobs, job, how",
    [
        (B, [ONE], TWO, B, "named on --log"),  # the operator's word wins
        (None, [ONE], TWO, A, "written by the job's processes"),
        (None, [ONE, frozenset()], TWO, A, "written by the job's processes"),  # and a stray writer
        (None, [ONE, frozenset({B})], TWO, None, "written by processes of 2 jobs"),
        (None, [frozenset()], ONE, None, "written only by processes of no job"),
        (None, [], ONE, A, "nobody holds it open and one job runs"),
        (None, [], TWO, None, "nobody holds it open and 2 jobs run on this node: name the job"),
        (None, [], frozenset(), None, "no job runs"),
    ],
)
def test_which_job_a_file_counts_for(named, writers, node_jobs, job, how):
    tie = decide(named, writers, node_jobs)
    assert tie.job == job and tie.how.startswith(how), tie
    assert isinstance(tie, Tie)


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
