"""After a restart, a job known before it and not heard from all its ranks yet is refreshing, never judged
from the ranks heard (monitor/diagnosis/silence.py); a new job, or one past the rebuild, is judged as ever."""

from __future__ import annotations

import pytest

from monitor.diagnosis import JobView, diagnose
from monitor.diagnosis.silence import REBUILD_S
from tests.diagnosis.builders import NOW, collective, job, rank, steps

RUNNING = steps(NOW - 0.1, 0.1)
STALLED = steps(NOW - 12, 0.1)
LINGERS = rank(1, node="node-b", cpu=100.0, active=True)

CASES: list[tuple[str, JobView, str, str]] = [
    ("restarted 2 s ago, rank 0's node not heard yet: refreshing, not healthy",
     job(LINGERS, world_size=2, progress=STALLED, monitor_started_at=NOW - 2),
     "unknown", "monitor restarted 2s ago: refreshing from the agents (1 of 2 ranks heard)"),
    ("every rank heard: judged",
     job(rank(0, frames=collective("all_reduce", 50)), LINGERS, progress=RUNNING, monitor_started_at=NOW - 2),
     "healthy", ""),
    ("a job first seen after the restart: its missing ranks are read by the rules, as ever",
     job(LINGERS, world_size=2, progress=RUNNING, monitor_started_at=NOW - 70), "healthy", ""),
    ("past the rebuild: judged from what is heard",
     job(LINGERS, world_size=2, progress=RUNNING, monitor_started_at=NOW - REBUILD_S - 1), "healthy", ""),
]


@pytest.mark.parametrize(("name", "view", "verdict", "summary"), CASES, ids=[c[0] for c in CASES])
def test_a_job_heard_in_part_after_a_restart(name: str, view: JobView, verdict: str, summary: str) -> None:
    found = diagnose(view)
    assert found.verdict == verdict, found.summary
    assert summary in found.summary
    if verdict == "unknown":
        assert found.culprit_ranks == () and "rank 0: not heard since the restart" in " ".join(found.evidence)
