"""What hangs cost (monitor/engine/hang_cost.py): table-style accounting, then the monitor's /diagnose
and /metrics for a deadlock that lasts (a stub diagnosis, the real app and SQLite)."""

from __future__ import annotations

import pytest

from monitor.engine.hang_cost import MAX_INTERVAL_S, UNATTRIBUTED, JobCost, account, lost_text

# (time, published verdict, live ranks, GPU ranks, culprit nodes) in order -> rank-seconds and
# GPU-seconds by verdict, GPU-seconds by (node, verdict).
CASES = {
    "healthy only": ([(0, "healthy", 8, 8, ()), (10, "healthy", 8, 8, ())], {}, {}, {}),
    "a deadlock of 10 s on 8 GPU ranks, culprit on n1": (
        [(0, "healthy", 8, 8, ()), (5, "deadlock", 8, 8, ("n1",)), (10, "deadlock", 8, 8, ("n1",)),
         (15, "healthy", 8, 8, ())],
        {"deadlock": 80.0}, {"deadlock": 80.0}, {("n1", "deadlock"): 80.0}),
    "culprits on two nodes share it; CPU ranks cost no GPU time": (
        [(0, "straggler", 4, 2, ("n1", "n2")), (3, "healthy", 4, 2, ())],
        {"straggler": 12.0}, {"straggler": 6.0}, {("n1", "straggler"): 3.0, ("n2", "straggler"): 3.0}),
    "no culprit named": ([(0, "stalled", 2, 2, ()), (4, "finished", 0, 0, ())],
                         {"stalled": 8.0}, {"stalled": 8.0}, {(UNATTRIBUTED, "stalled"): 8.0}),
    "a monitor outage counts MAX_INTERVAL_S at most": (
        [(0, "deadlock", 2, 0, ()), (1000, "deadlock", 2, 0, ())], {"deadlock": 2 * MAX_INTERVAL_S}, {}, {}),
    "a reading from the past (a replay) is ignored": (
        [(10, "deadlock", 2, 0, ()), (5, "healthy", 2, 0, ()), (12, "healthy", 2, 0, ())], {"deadlock": 4.0}, {}, {}),
}


@pytest.mark.parametrize("readings,rank_s,gpu_s,node_s", CASES.values(), ids=CASES.keys())
def test_accounting(readings, rank_s, gpu_s, node_s) -> None:
    cost, nodes = JobCost(), {}
    for now, verdict, ranks, gpus, culprit_nodes in readings:
        account(cost, now, verdict, ranks, gpus, culprit_nodes, nodes)
    assert (cost.rank_seconds, cost.gpu_seconds, nodes) == (rank_s, gpu_s, node_s)


def test_the_line_for_a_person() -> None:
    assert lost_text(JobCost()) is None
    text = lost_text(JobCost(rank_seconds={"deadlock": 7200.0, "straggler": 60.0}, gpu_seconds={"deadlock": 3600.0}))
    assert text == "time lost to hangs: 2.0 h of rank time (deadlock 2.0 h, straggler 60 s); 60.0 min of GPU time"


def test_a_lasting_deadlock_costs_its_ranks_time_in_the_answer_and_the_metrics(tmp_path, clock, monkeypatch) -> None:
    from monitor_reports import rank, report
    from monitor_testkit import TestClient
    from prometheus_client.parser import text_string_to_metric_families
    from test_api_diagnose import StubDiagnosis

    from monitor.web.app import create_app
    from monitor.web.settings import Settings
    from monitor.storage.store import open_store

    stub = StubDiagnosis()  # deadlock, culprit rank 1
    monkeypatch.setattr("monitor.diagnosis.diagnose", stub)
    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 0})
    store = open_store(settings, clock)
    gpu = [{"index": 0, "utilization_percent": 0.0}]
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            for node, r in (("node-a", 0), ("node-b", 1)):
                body = report(node=node, ranks=[rank(rank=r, pid=1000 + r, gpus=gpu)], sent_at=clock.now)
                assert client.post("/api/v1/reports", json=body).status_code == 202
            for _ in range(12):  # published on the second reading; then 10 s of it
                job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
                clock.advance(1)
            assert job["verdict"] == "deadlock"
            assert job["lost"] == {"rank_seconds": {"deadlock": 20.0}, "gpu_seconds": {"deadlock": 20.0}}
            text = client.get("/diagnose").text
            # One second later: 2 more rank-seconds.
            assert "time lost to hangs: 22 s of rank time (deadlock 22 s); 22 s of GPU time" in text, text
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples}
    finally:
        store.close()
    assert samples[("hangwatch_job_lost_rank_seconds_total", (("job_id", "job-a"), ("verdict", "deadlock")))] >= 20
    assert samples[("hangwatch_job_lost_gpu_seconds_total", (("job_id", "job-a"), ("verdict", "deadlock")))] >= 20
    assert samples[("hangwatch_node_lost_gpu_seconds_total", (("node", "node-b"), ("verdict", "deadlock")))] >= 20
