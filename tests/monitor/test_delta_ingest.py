"""Delta reports and node snapshots, through the real app: what the monitor keeps, stores and asks for."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from monitor_reports import progress, rank, report, socket, stack
from monitor_testkit import FakeClock, TestClient, monitor_of

from monitor.ingest.full_pacing import FullReportPacer
from monitor.web.app import create_app
from monitor.web.settings import Settings
from monitor.storage.store import Store, open_store

URL = "/api/v1/reports"


def post(client: TestClient, body: dict) -> dict:
    response = client.post(URL, json=body)
    assert response.status_code == 202, response.text
    return response.json()


def full_rank(clock: FakeClock, **fields: object) -> dict:
    return rank(rank=0, stack=stack(clock.now), env={"MASTER_PORT": "29500"},
                sockets=[socket("10.0.0.2:41000", "10.0.0.1:29500")], **fields)


def delta_rank(**fields: object) -> dict:
    """What the agent sends for an unchanged rank: no stack, sockets null, env and cmdline empty."""
    return rank(rank=0, stack=None, sockets=None, env={}, cmdline="", **fields)


def test_a_delta_keeps_what_the_full_report_said(client: TestClient, clock: FakeClock) -> None:
    assert post(client, report(ranks=[full_rank(clock)], sent_at=clock.now))["send_full"] is False
    clock.advance(1)
    answer = post(client, report(ranks=[delta_rank(cpu_percent=3.0)], sent_at=clock.now, host=None, delta=True))
    assert answer["delta"] is True and answer["send_full"] is False
    [result] = monitor_of(client).results()
    [view] = result.view.ranks
    assert view.cpu_percent == 3.0  # the news in the delta
    assert view.stack is not None and view.stack.frames  # kept from the full report
    assert [(s.remote, s.state) for s in view.sockets] == [("10.0.0.1:29500", "ESTABLISHED")]
    assert dict(view.env) == {"MASTER_PORT": "29500"}
    assert result.view.hosts["node-a"].cpu_model == "Test CPU"


def test_a_delta_from_a_node_without_a_full_report_asks_for_one(client: TestClient, clock: FakeClock) -> None:
    # As after a monitor restart: the agent does not know, and sends a delta.
    body = report(ranks=[delta_rank()], sent_at=clock.now, host=None, delta=True)
    assert post(client, body)["send_full"] is True
    clock.advance(1)
    assert post(client, dict(body, sent_at=clock.now))["send_full"] is True  # asked again until one comes
    clock.advance(1)
    assert post(client, report(ranks=[full_rank(clock)], sent_at=clock.now))["send_full"] is False
    clock.advance(1)
    assert post(client, dict(body, sent_at=clock.now))["send_full"] is False


def test_a_full_report_is_asked_for_when_the_snapshot_is_due(client: TestClient, clock: FakeClock,
                                                             settings: Settings, store: Store) -> None:
    post(client, report(ranks=[full_rank(clock)], sent_at=clock.now))
    delta = report(ranks=[delta_rank()], host=None, delta=True)
    clock.advance(1)
    assert post(client, dict(delta, sent_at=clock.now))["send_full"] is False
    clock.advance(settings.snapshot_interval_s * 1.2)  # past the node's spread interval
    assert post(client, dict(delta, sent_at=clock.now))["send_full"] is True
    assert store.count_snapshots() == 1
    post(client, report(ranks=[full_rank(clock)], sent_at=clock.now))
    assert store.count_snapshots() == 2


def test_an_agent_sending_full_reports_is_stored_once_per_interval(client: TestClient, clock: FakeClock,
                                                                    settings: Settings, store: Store) -> None:
    seconds = int(settings.snapshot_interval_s * 2.5)
    for _ in range(seconds):
        post(client, report(ranks=[full_rank(clock)], sent_at=clock.now))
        clock.advance(1)
    # One snapshot per 0.8-1.2 intervals (spread per node), never one per report.
    assert 2 <= store.count_snapshots() <= 4
    assert monitor_of(client).reports_total == seconds


def test_rejected_and_shed_reports_store_nothing(client: TestClient, clock: FakeClock, store: Store) -> None:
    post(client, report(ranks=[full_rank(clock)], sent_at=clock.now))
    guard = client.app.state.load_guard
    guard.note_lag(5.0, time.monotonic())  # far behind (for the next second): shed what can wait
    clock.advance(1)
    response = client.post(URL, json=report(ranks=[full_rank(clock, cpu_percent=1.0)], sent_at=clock.now))
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert guard.shed_total == 1
    assert monitor_of(client).reports_total == 1 and store.count_snapshots() == 1
    # A node the monitor has not heard from lately always gets in.
    assert client.post(URL, json=report(node="node-b", sent_at=clock.now)).status_code == 202


def test_a_node_owing_its_full_report_is_never_shed_and_its_deltas_wait_unapplied(
        client: TestClient, clock: FakeClock) -> None:
    """While the monitor is behind, the node whose full report its jobs wait on (after a restart: every
    node) gets in: its deltas are answered "send the full one" without being applied, its full report
    is taken."""
    delta = dict(report(ranks=[full_rank(clock)], sent_at=clock.now), delta=True)
    assert post(client, delta)["send_full"] is True  # a delta first: nothing to build on
    monitor, guard = monitor_of(client), client.app.state.load_guard
    taken = monitor.reports_total

    def behind() -> None:  # far behind, for the next second (of the real clock: noted before each post)
        guard.note_lag(5.0, time.monotonic())

    behind()
    clock.advance(1)
    answer = post(client, dict(delta, sent_at=clock.now))
    assert answer["send_full"] is True and answer["full_in_s"] >= 0
    assert (monitor.reports_total, monitor.figures().deltas_deferred, guard.shed_total) == (taken, 1, 0)
    clock.advance(1)
    behind()
    assert post(client, report(ranks=[full_rank(clock)], sent_at=clock.now))["send_full"] is False
    assert monitor.reports_total == taken + 1 and guard.shed_total == 0
    # Heard in full now: its next report, so soon after, is shed as any other's.
    clock.advance(1)
    behind()
    shed = client.post(URL, json=dict(delta, sent_at=clock.now))
    assert shed.status_code == 503 and guard.shed_total == 1


def test_the_old_reports_table_becomes_snapshots(tmp_path: Path, clock: FakeClock) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE reports (id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, "
                 "received_at REAL NOT NULL, body TEXT NOT NULL)")
    for i in range(3):
        body = report(ranks=[rank(job_id="old-job", step=i)], sent_at=clock.now - 10 + i)
        conn.execute("INSERT INTO reports (node, received_at, body) VALUES (?, ?, ?)",
                     ("node-a", clock.now - 10 + i, json.dumps(body)))
    conn.commit()
    conn.close()
    settings = Settings.from_raw({"db": db, "tick_interval_s": 0})
    store = open_store(settings, clock)
    try:
        assert store.count_snapshots() == 1  # the newest report of each node
        monitor = create_app(settings, store, clock=clock).state.monitor
        assert [r.view.job_id for r in monitor.results()] == ["old-job"]
    finally:
        store.close()
    tables = {name for (name,) in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "reports" not in tables


@pytest.fixture
def ticking_client(tmp_path: Path, clock: FakeClock) -> Iterator[TestClient]:
    """A monitor whose reads use the passes (a background tick is configured, but driven by hand here)."""
    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 3600})
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            yield client
    finally:
        store.close()


def advancing(clock: FakeClock, step: int, **fields: object) -> dict:
    recent = [(clock.now - 0.5, step - 1), (clock.now, step)]
    return report(ranks=[rank(rank=r, progress=progress(step, step, recent), **fields) for r in (0, 1)],
                  sent_at=clock.now)


def test_a_healthy_advancing_job_is_refreshed_every_few_seconds(ticking_client: TestClient, clock: FakeClock) -> None:
    monitor = monitor_of(ticking_client)
    post(ticking_client, advancing(clock, 10))
    monitor.tick()
    [first] = monitor.results()
    assert first.diagnosis.verdict == "healthy"
    clock.advance(1)
    post(ticking_client, advancing(clock, 11, cpu_percent=50.0))
    monitor.tick()
    assert monitor.results()[0] is first  # nothing that could change the verdict: not re-diagnosed
    clock.advance(5)
    post(ticking_client, advancing(clock, 16, cpu_percent=50.0))
    monitor.tick()
    [refreshed] = monitor.results()
    assert refreshed is not first and refreshed.view.ranks[0].cpu_percent == 50.0


def test_an_exit_is_diagnosed_at_once_on_a_healthy_job(ticking_client: TestClient, clock: FakeClock) -> None:
    monitor = monitor_of(ticking_client)
    post(ticking_client, advancing(clock, 10))
    monitor.tick()
    clock.advance(0.5)
    body = advancing(clock, 11)
    body["ranks"][1].update(alive=False, exit={"at": clock.now, "code": 1, "source": "proc"})
    post(ticking_client, body)
    [result] = monitor.results()  # a read, before any pass
    assert result.diagnosis.verdict == "rank_exited" and result.diagnosis.culprit_ranks == (1,)


def test_a_delta_the_monitor_cannot_build_on_is_not_read_as_the_present(client: TestClient, clock: FakeClock) -> None:
    """After a restart the agent's first reports are deltas on a picture this process does not hold
    (an old snapshot at best): a rank whose stale fields say "busy, last step long ago" would read as
    slow_compute. The job is refreshing until the full report it asks for arrives."""
    stale = [(clock.now - 40.5, 2), (clock.now - 40, 3)]
    busy = [delta_rank(cpu_percent=99.0, progress=progress(3, 3, stale)), dict(delta_rank(cpu_percent=99.0), rank=1)]
    assert post(client, report(ranks=busy, sent_at=clock.now, host=None, delta=True))["send_full"] is True
    job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
    assert job["verdict"] == "unknown", job["summary"]
    assert "full report is on its way" in " ".join(job["evidence"]), job["evidence"]
    clock.advance(1)
    assert post(client, report(ranks=[full_rank(clock, cpu_percent=99.0, progress=progress(4, 4, [(clock.now, 4)])),
                                      rank(rank=1, cpu_percent=99.0)], sent_at=clock.now))["send_full"] is False
    job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
    assert job["verdict"] != "unknown", job["summary"]


# --- after a restart: the herd of full reports, paced, and no verdict from a half-built picture ---

HERD_NODES = 40


def herd_report(clock: FakeClock, k: int, step: int, *, delta: bool = False) -> dict:
    """Node k of a job of HERD_NODES nodes (a rank each) that steps twice a second."""
    fields: dict = {"progress": progress(step, step, [(clock.now - 0.5, step - 1), (clock.now, step)])}
    if delta:
        fields.update(stack=None, sockets=None, env={}, cmdline="")
    body = report(node=f"node-{k:02d}", sent_at=clock.now,
                  ranks=[rank(job_id="herd", rank=k, world_size=HERD_NODES, local_rank=0, pid=1000, **fields)])
    return dict(body, delta=True, host=None) if delta else body


def herd_verdict(client: TestClient) -> dict:
    return client.get("/diagnose", params={"format": "json", "job": "herd"}).json()["jobs"][0]


def test_after_a_restart_full_reports_are_paced_and_the_job_is_never_healthy_half_built(
        settings: Settings, clock: FakeClock) -> None:
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            for step in range(1, 4):
                for k in range(HERD_NODES):
                    post(client, herd_report(clock, k, step))
                clock.advance(1)
            assert herd_verdict(client)["verdict"] == "healthy"
    finally:
        store.close()
    clock.advance(2)
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            # The snapshots restored are seconds old, and not the present: nothing was heard since.
            assert herd_verdict(client)["verdict"] == "unknown"
            # A herd of 40 is not paced at the monitor's rate; at 10 full reports a second it is.
            monitor_of(client)._full_pacer = FullReportPacer(per_s=10.0)
            # Every agent's next report is a delta this process cannot build on: each is told when to
            # send its full report, the herd spread over a window sized by the nodes restored.
            waits = [post(client, herd_report(clock, k, 20, delta=True)) for k in range(HERD_NODES)]
            assert all(w["send_full"] is True for w in waits)
            told = [w["full_in_s"] for w in waits]
            window = HERD_NODES / 10
            assert all(1.0 <= t <= 1.0 + window for t in told), told
            assert len(set(told)) > HERD_NODES / 2, told  # a slot each, not one for all
            seen = [herd_verdict(client)]
            # The full reports come in one by one: until the last, the job is refreshing, never judged.
            clock.advance(1)
            for k in range(HERD_NODES):
                answer = post(client, herd_report(clock, k, 22))
                assert answer["send_full"] is False and "full_in_s" not in answer
                seen.append(herd_verdict(client))
            *rebuilding, rebuilt = seen
            assert {s["verdict"] for s in rebuilding} == {"unknown"}, [s["summary"] for s in rebuilding]
            assert "refreshing" in rebuilding[-1]["summary"], rebuilding[-1]["summary"]
            assert rebuilt["verdict"] == "healthy", rebuilt["summary"]
            assert monitor_of(client).full_reports_total == HERD_NODES
            # Their snapshots, restored, would fall due within the minute (the first ones of the job's
            # start, 48-72 s old by then): the full reports just taken put them an interval off.
            clock.advance(47)
            answers = [post(client, herd_report(clock, k, 120, delta=True)) for k in range(HERD_NODES)]
            assert not any(a["send_full"] for a in answers)
    finally:
        store.close()
