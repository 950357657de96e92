"""After a restart every node of a giant job delivers what its agent kept through the outage: those
replayed reports are applied, and the job is judged by the next pass, not once per report (at
10,000 ranks that was ~0.1 s of the event loop each, 1,250 of them: benchmarks/monitor_scale.py
--restart --journal). A small job's replays are still judged each at its own time."""

from __future__ import annotations

import orjson
from monitor_reports import rank, report
from monitor_testkit import FakeClock

from monitor.diagnosis import Diagnosis, JobView
from monitor.engine.service import GIANT_JOB_RANKS, Monitor
from monitor.ingest.fastwire import decode_report
from monitor.storage.store import Store

NODES = GIANT_JOB_RANKS // 8 + 2  # 8 ranks a node: a giant job


def node_body(clock: FakeClock, job: str, k: int, world: int, *, replayed: bool = False):
    ranks = [rank(job_id=job, rank=8 * k + i, world_size=world, local_rank=i, pid=1000 + i) for i in range(8)]
    return decode_report(orjson.dumps(report(node=f"{job}-node-{k:03d}", ranks=ranks, sent_at=clock.now,
                                             replayed=replayed)))


def test_a_giant_jobs_replayed_reports_are_applied_and_judged_by_the_next_pass(tmp_path) -> None:
    clock = FakeClock()
    judged: list[str] = []

    def diagnose(view: JobView) -> Diagnosis:
        judged.append(view.job_id)
        return Diagnosis("healthy", (), None, "ok")

    store = Store(tmp_path / "m.db", clock=clock)
    try:
        monitor = Monitor(store, clock=clock, diagnose=diagnose, tick_interval_s=1.0)
        for k in range(NODES):
            monitor.ingest(node_body(clock, "giant", k, 8 * NODES))
        monitor.ingest(node_body(clock, "small", 0, 8))
        monitor.tick()
        judged.clear()
        clock.advance(30)  # the outage; the agents' kept reports come in
        for k in range(NODES):
            monitor.ingest(node_body(clock, "giant", k, 8 * NODES, replayed=True))
        monitor.ingest(node_body(clock, "small", 0, 8, replayed=True))
        assert judged == ["small"]  # the small job at its replayed report's time; the giant one not once per node
        assert monitor.replayed_total == NODES + 1
        monitor.tick()
        assert "giant" in judged  # by the pass
    finally:
        store.close()
