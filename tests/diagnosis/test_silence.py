"""A node whose agent went silent: its ranks are unknown and never evidence, table-style."""

from __future__ import annotations

import signal

import pytest

from monitor.diagnosis import ExitView, JobView, LauncherView, diagnose
from monitor.diagnosis.context import ranks_text
from tests.diagnosis.builders import NOW, collective, computing, job, rank, sleeping, steps

RUNNING = steps(NOW - 0.1, 0.1)
STALLED = steps(NOW - 12, 0.1)
BUSY = {"cpu": 100.0, "frames": computing(), "active": True}
SILENT_B = (("node-b", NOW - 80),)

CASES: list[tuple[str, JobView, str, dict[int, str], str]] = [
    ("busy ranks on a silent node are no slow compute",
     job(rank(0, **BUSY), rank(1, node="node-b", **BUSY), silent_nodes=SILENT_B),
     "unknown", {1: "unknown"}, "agent on node-b silent for 80s: rank 1 unknown"),
    ("every node silent: nothing is judged from 80-second-old data",
     job(rank(0, **BUSY), rank(1, **BUSY), silent_nodes=(("node-a", NOW - 80),)),
     "unknown", {0: "unknown", 1: "unknown"}, "agent on node-a silent for 80s"),
    ("idle ranks in a collective on a silent node are no deadlock",
     job(rank(0, frames=collective("all_reduce", 50)), rank(1, node="node-b", frames=sleeping()), progress=STALLED,
         silent_nodes=SILENT_B),
     "unknown", {1: "unknown"}, "silent"),
    ("a healthy-looking silent node is not healthy either",
     job(rank(0, **BUSY), rank(1, node="node-b", **BUSY), progress=RUNNING, silent_nodes=SILENT_B),
     "unknown", {1: "unknown"}, "no verdict from old data"),
    ("a rank that exited on a reporting node still explains the job",
     job(rank(0, alive=False, exit=ExitView(NOW - 5, None, signal.SIGKILL)), rank(1, node="node-b", **BUSY),
         silent_nodes=SILENT_B),
     "rank_exited", {}, ""),
    ("just restarted: the replayed nodes are being refreshed, not lost",
     job(rank(0, **BUSY), rank(1, node="node-b", **BUSY), silent_nodes=SILENT_B, monitor_started_at=NOW - 3),
     "unknown", {1: "unknown"}, "monitor restarted 3s ago: refreshing from the agents (waiting for node-b)"),
    ("a launcher on a silent node that had started no workers yet is no rendezvous hang",
     job(silent_nodes=(("node-a", NOW - 40),),
         launchers=(LauncherView(node="node-a", pid=77, alive=True, first_seen_at=NOW - 60, node_rank=None,
                                 nnodes=None, nproc_per_node="2", master_addr="127.0.0.1", master_port=29500,
                                 worker_count=0),)),
     "unknown", {}, "agent on node-a silent for 40s: its launcher unknown"),
    ("ranks that ended, judged now from reports still being replayed, are the past's facts",
     job(rank(0, alive=False, exit=ExitView(NOW - 30, 1, None)), rank(1, alive=False, exit=ExitView(NOW - 33, 0, None)),
         replaying_nodes=(("node-a", NOW - 28),)),
     "unknown", {}, "refreshing: the agent on node-a is delivering what it kept through an outage"),
    ("a replayed report judged at its own time is the present then",
     job(rank(0, alive=False, exit=ExitView(NOW - 2, 1, None)), rank(1, **BUSY), replaying_nodes=(("node-a", NOW),)),
     "rank_exited", {}, "rank 0 ended first"),
    ("a silent node without a live rank of this job changes nothing",
     job(rank(0, **BUSY), rank(1, **BUSY), progress=RUNNING, silent_nodes=()),
     "healthy", {}, ""),
]


@pytest.mark.parametrize(("name", "view", "verdict", "states", "summary"), CASES, ids=[c[0] for c in CASES])
def test_silent_agents(name: str, view: JobView, verdict: str, states: dict[int, str], summary: str) -> None:
    found = diagnose(view)
    assert found.verdict == verdict, found.summary
    assert summary in found.summary
    shown = {r.rank: r.state for r in found.ranks}
    assert all(shown[r] == s for r, s in states.items()), shown
    if verdict == "unknown":
        assert found.culprit_ranks == ()


def test_a_lost_agent_says_what_to_check_and_a_restart_does_not() -> None:
    lost = diagnose(job(rank(0, **BUSY), rank(1, node="node-b", **BUSY), silent_nodes=SILENT_B))
    assert any("systemctl status hangwatch-agent" in h for h in lost.hints)
    restarted = diagnose(job(rank(0, **BUSY), rank(1, node="node-b", **BUSY), silent_nodes=SILENT_B,
                             monitor_started_at=NOW - 3))
    assert restarted.hints == ()


@pytest.mark.parametrize(("ranks", "text"), [
    ([3], "rank 3"),
    ([2, 0, 1], "ranks 0, 1, 2"),
    (range(16), "ranks " + ", ".join(str(r) for r in range(16))),
    (range(1, 1_000_000), "ranks 1-999999"),
    ([*range(0, 100, 2)], "ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, ... "
                          "(50 ranks in all)"),
])
def test_rank_lists_stay_short(ranks: list[int], text: str) -> None:
    assert ranks_text(ranks) == text


def test_after_a_restart_under_a_giant_job_the_waiting_nodes_are_counted_not_listed() -> None:
    """2,000 nodes not heard since a restart: the summary collapses them, the evidence counts the rest."""
    silent = tuple((f"node{n:04d}", NOW - 20) for n in range(2000))
    ranks = [rank(r, node=f"node{r // 8:04d}", **BUSY) for r in range(16_000)]
    found = diagnose(job(*ranks, silent_nodes=silent, monitor_started_at=NOW - 5))
    assert found.verdict == "unknown" and found.culprit_ranks == ()
    assert "refreshing from the agents (waiting for 2000 nodes: node[0000-1999])" in found.summary
    assert len(found.evidence) <= 12 and "... and 1992 more nodes" in found.evidence
    assert len(found.summary) < 200
