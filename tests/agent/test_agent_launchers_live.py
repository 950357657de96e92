"""The real agent finds ranks whose environment does not name them, on real process trees.

Stand-ins without torch.distributed (the e2e tests run the real jobs): a process tree shaped
like Lightning's launch, and spawn_main children like mp.spawn's. Every process started here
is killed by pid, also when a test fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from agent.derived_ranks import Candidate, DerivedRanks
from agent.identity import LightningChild
from agent.procstat import Stat
from hangwatch.demo.harness import free_port
from monitor.ingest.wire import Report
from tests.agent.conftest import _kill, run_agent_once

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

SPAWN_ARGV = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, pipe_handle=6)",
              "--multiprocessing-fork"]

# Lightning's launch: the user's process re-runs its own command with LOCAL_RANK, NODE_RANK,
# WORLD_SIZE and the master set. Also another program with the same variables (not a rank of
# this launch) and, in the child, a forked helper that inherits them (a DataLoader worker).
LIGHTNING_TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    if "LOCAL_RANK" not in os.environ:
        env = dict(os.environ, LOCAL_RANK="1", NODE_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=sys.argv[1])
        child = subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0])] + sys.argv[1:], env=env)
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
        print(f"children {child.pid} {other.pid}", flush=True)
    else:
        helper = os.fork()
        if helper == 0:
            time.sleep(600)
            os._exit(0)
        print(f"helper {helper}", flush=True)
    time.sleep(600)
    """
)

# mp.spawn's processes ("store": rank 0 listens on a port, every rank connects to it, as
# torch's TCPStore does) or a spawn Pool's workers with torch loaded and no sockets ("pool").
SPAWNED = textwrap.dedent(
    """
    import socket, sys, time

    def rank(index, port):
        import torch  # noqa: F401 -- libtorch in the maps, as in any torch rank
        if index == 0:
            server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen(8)
        for _ in range(200):
            try:
                client = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.05)
        print(f"ready {index}", flush=True)
        time.sleep(600)

    def worker_init():
        import torch  # noqa: F401
        print("ready pool", flush=True)

    if __name__ == "__main__":
        mode, port = sys.argv[1], int(sys.argv[2])
        if mode == "store":
            import torch.multiprocessing as mp
            mp.spawn(rank, args=(port,), nprocs=2)
        else:
            import multiprocessing as mp
            with mp.get_context("spawn").Pool(2, initializer=worker_init) as pool:
                time.sleep(600)
    """
)


# accelerate's and DeepSpeed's launchers, shaped as the real ones run: ``accelerate launch``
# starts the workers itself; ``deepspeed`` starts ``python -u -m deepspeed.launcher.launch``,
# which starts them. The workers carry RANK/WORLD_SIZE and the master.
FAKE_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    port = os.environ["FAKE_MASTER_PORT"]
    if os.path.basename(sys.argv[0]) == "deepspeed":
        inner = subprocess.Popen([sys.executable, "-u", "-m", "deepspeed.launcher.launch"])
        print(f"inner {inner.pid}", flush=True)
    else:
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
            print(f"worker {worker.pid}", flush=True)
    time.sleep(600)
    """
)


class Tree:
    """One parent process and everything it starts; killed by pid, children first."""

    def __init__(self, tmp_path: Path, script: str, *args: str, name: str = "tree.py", **env: str) -> None:
        self.path = tmp_path / name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(script)
        self.log = tmp_path / f"{self.path.name}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, str(self.path), *args], stdout=out,
                                         stderr=subprocess.STDOUT, cwd=tmp_path, env={**os.environ, **env})
        self.pids: set[int] = set()

    def wait_for(self, text: str, count: int = 1, timeout: float = 60.0) -> list[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.remember_children()
            lines = [line for line in self.log.read_text().splitlines() if line.startswith(text)]
            if len(lines) >= count:
                return lines
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"no {count} {text!r} lines:\n{self.log.read_text()}")

    def remember_children(self) -> None:
        try:
            self.pids.update(c.pid for c in psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def close(self) -> None:
        self.remember_children()
        for pid in sorted(self.pids, reverse=True):
            _kill(pid)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def trees(tmp_path):
    started: list[Tree] = []

    def start(script: str, *args: str, name: str = "tree.py", **env: str) -> Tree:
        started.append(Tree(tmp_path, script, *args, name=name, **env))
        return started[-1]

    try:
        yield start
    finally:
        for tree in started:
            tree.close()


def _ranks(report: dict, job: str) -> dict[int, dict]:
    return {r["rank"]: r for r in report["ranks"] if r["job_id"] == job}


def test_lightning_launch_parent_is_rank_0(trees):
    port = str(free_port())
    tree = trees(LIGHTNING_TREE, port)
    child, other = (int(p) for p in tree.wait_for("children ")[0].split()[1:])
    helper = int(tree.wait_for("helper ")[0].split()[1])
    time.sleep(1.2)  # a launch is reported once its youngest process is a second old
    job = f"127.0.0.1:{port}"
    report = run_agent_once("--interval", "0.3", "--no-stacks", "--job", job)
    Report.model_validate(report)
    found = _ranks(report, job)
    assert sorted(found) == [0, 1], report["ranks"]
    assert found[0]["pid"] == tree.proc.pid and found[1]["pid"] == child
    assert found[0]["identified_by"] == "lightning:parent-of-LOCAL_RANK-children"
    assert found[1]["identified_by"] == "lightning:LOCAL_RANK"
    assert {r["launcher"] for r in found.values()} == {"lightning"}
    assert {r["world_size"] for r in found.values()} == {2} and found[1]["local_rank"] == 1
    assert not {helper, other} & {r["pid"] for r in report["ranks"]}


def test_spawned_processes_with_a_store_are_ranks_in_start_order(trees):
    port = free_port()
    tree = trees(SPAWNED, "store", str(port))
    tree.wait_for("ready ", count=2)
    spawned = sorted((p.create_time(), p.pid) for p in psutil.Process(tree.proc.pid).children()
                     if "--multiprocessing-fork" in p.cmdline())
    assert len(spawned) == 2
    job = f"spawn:{tree.proc.pid}"
    report = run_agent_once("--interval", "0.3", "--no-stacks", "--job", job)
    Report.model_validate(report)
    found = _ranks(report, job)
    assert {r: found[r]["pid"] for r in found} == {0: spawned[0][1], 1: spawned[1][1]}, report["ranks"]
    assert {(r["launcher"], r["identified_by"], r["world_size"]) for r in found.values()} == {
        ("mp.spawn", "mp.spawn:start-order", 2)
    }


def test_spawned_pool_workers_are_not_ranks(trees):
    tree = trees(SPAWNED, "pool", "0")
    tree.wait_for("ready pool", count=2)
    time.sleep(1.2)
    workers = {p.pid for p in psutil.Process(tree.proc.pid).children() if "--multiprocessing-fork" in p.cmdline()}
    assert len(workers) == 2
    report = run_agent_once("--interval", "0.3", "--no-stacks")
    assert not workers & {r["pid"] for r in report["ranks"]}, report["ranks"]
    assert tree.proc.pid not in {r["pid"] for r in report["ranks"]}
    assert os.getpid() not in {r["pid"] for r in report["ranks"]}


@pytest.mark.parametrize("launcher", ["accelerate", "deepspeed"])
def test_accelerate_and_deepspeed_launchers_name_their_workers(trees, tmp_path, launcher):
    port = str(free_port())
    package = tmp_path / "pkgs" / "deepspeed" / "launcher"
    package.mkdir(parents=True)
    for init in (package.parent / "__init__.py", package / "__init__.py"):
        init.write_text("")
    (package / "launch.py").write_text(FAKE_LAUNCHER)
    # Under srun the launcher itself carries Slurm's rank variables: still not a rank.
    args = ("launch", "train.py") if launcher == "accelerate" else ("train.py",)
    tree = trees(FAKE_LAUNCHER, *args, name=f"bin/{launcher}", FAKE_MASTER_PORT=port,
                 PYTHONPATH=str(tmp_path / "pkgs"), SLURM_PROCID="0", SLURM_NTASKS="1")
    workers = {int(line.split()[1]) for line in tree.wait_for("worker ", count=2)}
    inner = int(tree.wait_for("inner ")[0].split()[1]) if launcher == "deepspeed" else None
    job = f"127.0.0.1:{port}"
    report = run_agent_once("--interval", "0.3", "--no-stacks")
    Report.model_validate(report)
    found = _ranks(report, job)
    assert {r["pid"] for r in found.values()} == workers, report["ranks"]
    assert {(r["launcher"], r["identified_by"]) for r in found.values()} == {(launcher, "env:RANK")}
    assert tree.proc.pid not in {r["pid"] for r in report["ranks"]}
    launchers = {lr["pid"]: lr for lr in report["launchers"]}
    parent = inner if launcher == "deepspeed" else tree.proc.pid
    assert launchers[parent]["job_id"] == job and sorted(launchers[parent]["worker_pids"]) == sorted(workers)
    if launcher == "deepspeed":
        assert tree.proc.pid not in launchers  # the runner only wraps deepspeed.launcher.launch


def test_vanished_processes_are_skipped_not_fatal():
    """Candidates and parents that ended between the scan and the reads: nothing found, no error."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    gone = ended.pid

    def stat(pid: int, ppid: int) -> Stat:
        return Stat(pid, "python", "S", ppid, 0, 0, 1, 1, 0, None)

    stats = {gone: stat(gone, 1), os.getpid(): stat(os.getpid(), os.getppid())}
    lightning = Candidate(gone + 10**6, gone, 2, "python t.py", ("python", "t.py"), {},
                          lightning=LightningChild(1, 0, 2, "h:1"))
    spawned = Candidate(gone + 10**6 + 1, os.getpid(), 2, "python -c ...", tuple(SPAWN_ARGV), {}, spawn_facts={})
    derived = DerivedRanks()
    assert derived.find(stats, [lightning, spawned], set()) == []
    assert derived.find(stats, [lightning, spawned], set()) == []  # again, from the caches
