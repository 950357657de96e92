"""A rank first seen between its fork and its exec is still found once it runs (agent/discovery.py)."""

from __future__ import annotations

from pathlib import Path

from agent.discovery import Discovery
from agent.procstat import CLOCK_TICKS
from tests.agent.fake_proc import fake_process

BOOTED_S = 100_000.0
LIGHTNING_CHILD_ENV = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29512"}


def _uptime(root: Path, seconds: float) -> None:
    (root / "uptime").write_text(f"{seconds:.2f} 1.00\n")


def test_a_lightning_child_seen_before_its_exec_is_found_after_it(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    _uptime(root, BOOTED_S)
    parent_argv = ["python3", "fit.py", "--epochs", "3"]
    fake_process(root, 300, 50, parent_argv, {}, starttime=int((BOOTED_S - 60) * CLOCK_TICKS))
    # Forked, not yet exec'd: the child shows its parent's command line and environment (and the
    # same comm as after the exec, python running python).
    child_started = int((BOOTED_S - 0.2) * CLOCK_TICKS)
    fake_process(root, 301, 300, parent_argv, {}, starttime=child_started)
    discovery = Discovery(proc_root=str(root), self_pid=999_999)
    assert discovery.scan() == []
    fake_process(root, 301, 300, ["python3", "/w/fit.py", "--epochs", "3"], LIGHTNING_CHILD_ENV,
                 starttime=child_started)  # the exec: same pid, start time and comm
    _uptime(root, BOOTED_S + 5)  # the launch has settled
    ranks = discovery.scan()
    assert sorted((r.pid, r.identity.rank) for r in ranks) == [(300, 0), (301, 1)]
