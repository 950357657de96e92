"""Incidents and suspect nodes (monitor/engine/incidents.py), table-style: published verdict changes in,
incidents and node rankings out; then the monitor keeping them across a restart (real SQLite)."""

from __future__ import annotations

import pytest

from monitor.engine.incidents import Incident, incidents, suspect_nodes
from monitor.storage.store import VerdictChange


def c(job: str, at: float, verdict: str, ranks: tuple[int, ...] = (), nodes: tuple[str, ...] = ()) -> VerdictChange:
    return VerdictChange(job, at, verdict, ranks, f"raw {verdict}", nodes)


INCIDENTS = {
    "healthy only: none": ([c("j", 0, "healthy")], []),
    "a deadlock that clears": (
        [c("j", 0, "healthy"), c("j", 10, "deadlock", (1,), ("n1",)), c("j", 30, "healthy")],
        [Incident("j", "deadlock", (1,), ("n1",), 10, 30)]),
    # A stall sharpened into a deadlock is one incident, named by its last verdict, with every culprit.
    "stalled then deadlock then a rank exits": (
        [c("j", 10, "stalled"), c("j", 12, "deadlock", (1,), ("n1",)), c("j", 20, "rank_exited", (0, 1), ("n0", "n1"))],
        [Incident("j", "rank_exited", (0, 1), ("n0", "n1"), 10, None)]),
    # unknown (an agent silent) neither opens nor ends one.
    "a deadlock through an agent's silence": (
        [c("j", 10, "deadlock", (1,), ("n1",)), c("j", 15, "unknown"), c("j", 20, "deadlock", (1,), ("n1",)),
         c("j", 40, "finished")],
        [Incident("j", "deadlock", (1,), ("n1",), 10, 40)]),
    "unknown alone: none": ([c("j", 0, "unknown"), c("j", 5, "healthy")], []),
    "two incidents of one job, changes out of order": (
        [c("j", 50, "healthy"), c("j", 10, "straggler", (0,), ("n0",)), c("j", 60, "rank_stopped", (1,), ("n1",)),
         c("j", 20, "healthy")],
        [Incident("j", "straggler", (0,), ("n0",), 10, 20), Incident("j", "rank_stopped", (1,), ("n1",), 60, None)]),
    "two jobs": (
        [c("a", 5, "deadlock", (1,), ("n1",)), c("b", 1, "slow_compute"), c("b", 9, "healthy")],
        [Incident("b", "slow_compute", (), (), 1, 9), Incident("a", "deadlock", (1,), ("n1",), 5, None)]),
}


@pytest.mark.parametrize("changes,expected", INCIDENTS.values(), ids=INCIDENTS.keys())
def test_incidents(changes: list[VerdictChange], expected: list[Incident]) -> None:
    assert incidents(changes) == expected


def inc(job: str, start: float, end: float | None, verdict: str, *nodes: str) -> Incident:
    return Incident(job, verdict, (), nodes, start, end)


def test_nodes_are_ranked_by_distinct_jobs_then_incidents() -> None:
    found = [
        inc("a", 100, 110, "deadlock", "bad"), inc("a", 200, 210, "deadlock", "bad"),  # one job, twice
        inc("b", 300, None, "rank_exited", "bad", "ok-ish"),
        inc("c", 150, 160, "straggler", "flaky"), inc("d", 170, 180, "straggler", "flaky"),
        inc("e", 190, 195, "deadlock", "flaky"),
        inc("f", 10, 20, "deadlock", "old"),  # ended before the window
    ]
    ranked = suspect_nodes(found, since=50)
    assert [(n.node, n.jobs, n.incidents) for n in ranked] == [
        ("flaky", ["e", "d", "c"], 3),
        ("bad", ["b", "a"], 3),
        ("ok-ish", ["b"], 1),
    ]
    assert ranked[0].verdicts == {"deadlock": 1, "straggler": 2} and ranked[0].last_at == 190
    # An incident that began before the window and lasted into it counts.
    assert [n.node for n in suspect_nodes([inc("g", 10, 60, "deadlock", "long")], since=50)] == ["long"]


# --- the monitor: changes stored with their nodes, suspects read back, across a restart ---

def _monitor(tmp_path, clock):
    from monitor.web.app import create_app
    from monitor.web.settings import Settings
    from monitor.storage.store import open_store

    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 0})
    store = open_store(settings, clock)
    return create_app(settings, store, clock=clock), store


def test_a_node_that_breaks_two_jobs_is_the_first_suspect_and_stays_one_across_a_restart(
        tmp_path, clock, monkeypatch) -> None:
    from monitor_reports import rank, report
    from monitor_testkit import TestClient
    from prometheus_client.parser import text_string_to_metric_families
    from test_api_diagnose import StubDiagnosis

    stub = StubDiagnosis()  # every job: deadlock, culprit rank 1
    monkeypatch.setattr("monitor.diagnosis.diagnose", stub)

    def samples(client: TestClient) -> dict[tuple[str, tuple], float]:
        text = client.get("/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("hangwatch_node_")}

    app, store = _monitor(tmp_path, clock)
    with TestClient(app) as client:
        for node, r in (("node-ok", 0), ("node-bad", 1)):
            ranks = [rank(job_id=job, rank=r, pid=1000 * (i + 1) + r) for i, job in enumerate(("job-a", "job-b"))]
            assert client.post("/api/v1/reports", json=report(node=node, ranks=ranks, sent_at=clock.now)).status_code == 202
        for _ in range(3):  # the deadlock confirmed: two readings a second apart
            client.get("/diagnose", params={"format": "json"})
            clock.advance(1)
        answer = client.get("/api/v1/nodes/suspects").json()
        assert [(n["node"], sorted(n["jobs"]), n["verdicts"]) for n in answer["nodes"]] == [
            ("node-bad", ["job-a", "job-b"], {"deadlock": 2})]
        got = samples(client)
        assert got[("hangwatch_node_culprit_jobs", (("node", "node-bad"),))] == 2
        assert got[("hangwatch_node_incidents_total", (("node", "node-bad"), ("verdict", "deadlock")))] == 2
        assert client.get("/api/v1/nodes/suspects", params={"window_s": 0}).status_code == 422
    store.close()

    clock.advance(3600)  # a restart an hour later: read back from the database
    app, store = _monitor(tmp_path, clock)
    with TestClient(app) as client:
        answer = client.get("/api/v1/nodes/suspects").json()
        assert [(n["node"], n["jobs_total"]) for n in answer["nodes"]] == [("node-bad", 2)]
        assert samples(client)[("hangwatch_node_culprit_jobs", (("node", "node-bad"),))] == 2
        assert client.get("/api/v1/nodes/suspects", params={"window_s": 60}).json()["nodes"] == []
    store.close()
