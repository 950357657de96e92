"""The SQLite store: a restarted monitor keeps its picture from node snapshots; old ones are pruned."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from monitor_reports import launcher, progress, rank, report, socket, stack
from monitor_testkit import FakeClock, TestClient, monitor_of

from monitor.web.app import create_app
from monitor.diagnosis import Diagnosis, JobView
from monitor.engine.service import Monitor
from monitor.web.settings import Settings
from monitor.storage.store import Store, VerdictChange, open_store
from monitor.ingest.fastwire import decode_report


def test_a_restarted_monitor_sees_the_job(settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("monitor.diagnosis.diagnose", lambda job: Diagnosis("deadlock", (1,), None, "stuck"))
    p = progress(4, 40, [(clock.now - 1, 40)])
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            for i in range(3):
                body = report(ranks=[rank(rank=0, progress=p, state="R" if i < 2 else "S"), rank(rank=1)],
                              sent_at=clock.now)
                assert client.post("/api/v1/reports", json=body).status_code == 202
                clock.advance(1)
            monitor_of(client).tick()
            before = client.get("/diagnose", params={"format": "json"}).json()
    finally:
        store.close()

    clock.advance(30)
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            after = client.get("/diagnose", params={"format": "json"}).json()
            [job] = after["jobs"]
            assert job["job_id"] == "job-a"
            assert [r["rank"] for r in job["ranks"]] == [0, 1]
            assert job["ranks"][0]["step"] == 40
            assert job["ranks"][0]["seconds_since_progress"] == pytest.approx(
                before["jobs"][0]["ranks"][0]["seconds_since_progress"] + 30
            )
            view = monitor_of(client).results()[0].view
            # One snapshot per node and interval: the first report was kept, with its receive time.
            assert view.ranks[0].state_since == clock.now - 33
            assert view.ranks[0].first_seen_at == clock.now - 33
            assert view.ranks[0].proc_state == "R"
            # The verdict did not change across the restart, so it is not recorded twice.
            monitor_of(client).tick()
            history = client.get("/api/v1/jobs/job-a/history").json()["history"]
            assert [h["verdict"] for h in history] == ["deadlock"]
    finally:
        store.close()


def test_replay_skips_reports_older_than_the_retention(settings: Settings, clock: FakeClock) -> None:
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            client.post("/api/v1/reports", json=report(ranks=[rank(job_id="old")], sent_at=clock.now))
    finally:
        store.close()
    clock.advance(settings.snapshot_retention_s + 1)
    store = open_store(settings, clock)
    try:
        assert monitor_of_app(settings, store, clock).results() == []
    finally:
        store.close()


def monitor_of_app(settings: Settings, store: Store, clock: FakeClock) -> Monitor:
    return create_app(settings, store, clock=clock).state.monitor


def test_store_prunes_by_age_and_per_node_cap(tmp_path: Path, clock: FakeClock) -> None:
    store = Store(tmp_path / "m.db", snapshot_retention_s=100, snapshots_per_node=3, clock=clock)
    try:
        for i in range(6):
            store.add_snapshot("a", clock.now + i, f'{{"i": {i}}}')
        store.add_snapshot("b", clock.now - 500, "{}")
        store.prune(clock.now + 6)
        store.flush()
        rows = list(store.recent_snapshots(since=0))
        assert [(r.node, r.body) for r in rows] == [("a", b'{"i": 3}'), ("a", b'{"i": 4}'), ("a", b'{"i": 5}')]
    finally:
        store.close()
    conn = sqlite3.connect(tmp_path / "m.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_verdict_history_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db", clock=lambda: 10.0)
    try:
        store.add_verdict(VerdictChange("j", 1.0, "healthy", (), "ok"))
        store.add_verdict(VerdictChange("j", 2.0, "deadlock", (0, 2), "stuck"))
        store.add_verdict(VerdictChange("k", 3.0, "finished", (), "done"))
        assert store.verdict_history("j") == [
            VerdictChange("j", 1.0, "healthy", (), "ok"),
            VerdictChange("j", 2.0, "deadlock", (0, 2), "stuck"),
        ]
        assert {k: v.verdict for k, v in store.latest_verdicts().items()} == {"j": "deadlock", "k": "finished"}
    finally:
        store.close()


def test_a_stored_report_that_no_longer_validates_is_skipped(
    settings: Settings, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(settings, clock)
    try:
        store.add_snapshot("n", clock.now, '{"schema_version": 99}')
        store.add_snapshot("n", clock.now, json.dumps(report(sent_at=clock.now)))
        monitor = monitor_of_app(settings, store, clock)
        assert [r.view.job_id for r in monitor.results()] == ["job-a"]
        assert "no longer validates" in caplog.text
    finally:
        store.close()


def test_diagnosis_is_given_a_whole_job_view(settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[JobView] = []

    def record(job: JobView) -> Diagnosis:
        seen.append(job)
        return Diagnosis("healthy", (), None, "fine")

    monkeypatch.setattr("monitor.diagnosis.diagnose", record)
    store = open_store(settings, clock)
    try:
        monitor = monitor_of_app(settings, store, clock)
        monitor.ingest(decode_report(json.dumps(report(ranks=[rank(world_size=8)], sent_at=clock.now))))
        monitor.results()
        assert seen[-1].world_size == 8 and seen[-1].now == clock.now
    finally:
        store.close()


def test_replay_restores_launchers_sockets_and_stacks(settings: Settings, clock: FakeClock) -> None:
    syn = socket("10.0.0.2:41000", "10.0.0.1:29500", "SYN_SENT")
    start = clock.now
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            for _ in range(5):
                body = report(node="node-b", ranks=[], sent_at=clock.now,
                              launchers=[launcher(job_id="waiting", nnodes="2", nproc_per_node="2", sockets=[syn])])
                assert client.post("/api/v1/reports", json=body).status_code == 202
                body = report(node="node-a", ranks=[rank(job_id="busy", stack=stack(clock.now))], sent_at=clock.now)
                assert client.post("/api/v1/reports", json=body).status_code == 202
                clock.advance(1)
    finally:
        store.close()

    clock.advance(30)
    store = open_store(settings, clock)
    try:
        monitor = monitor_of_app(settings, store, clock)
        views = {r.view.job_id: r.view for r in monitor.results()}
        waiting = views["waiting"]
        assert waiting.world_size == 4 and waiting.ranks == ()
        [lv] = waiting.launchers
        assert (lv.node, lv.first_seen_at) == ("node-b", start)
        assert [(s.state, s.since) for s in lv.sockets] == [("SYN_SENT", start)]
        # The stack of the snapshot is back; the wait share needs fresh samples after a restart.
        assert views["busy"].ranks[0].stack is not None
    finally:
        store.close()


def test_a_restarted_monitor_makes_no_room_until_it_has_listened_as_long_as_silence_takes(
        db_path: Path, clock: FakeClock) -> None:
    """After a restart every job's last report is its snapshot's, so all look silent: a report
    bringing new ranks must not make live jobs give their room until the monitor has listened for
    job_room_silent_s; a job still silent then does give it."""
    settings = Settings.from_raw({"db": db_path, "tick_interval_s": 0, "max_ranks": 4, "job_room_silent_s": 60,
                                  "shed_lag_s": 4.0})
    newcomer = report(node="node-b", ranks=[rank(job_id="job-new", rank=0), rank(job_id="job-new", rank=1)])
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            body = report(node="node-a", ranks=[rank(job_id="job-a", rank=r, world_size=4) for r in range(4)], sent_at=clock.now)
            assert client.post("/api/v1/reports", json=body).status_code == 202
    finally:
        store.close()

    clock.advance(120)  # down two minutes: job-a's snapshot is that old
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            refused = client.post("/api/v1/reports", json={**newcomer, "sent_at": clock.now})
            assert refused.status_code == 429 and "max_ranks" in refused.json()["detail"], refused.text
            assert "job-a" in monitor_of(client).job_ids()  # not forgotten for a newcomer
            clock.advance(61)  # listened a minute: job-a, still silent, gives its room
            assert client.post("/api/v1/reports", json={**newcomer, "sent_at": clock.now}).status_code == 202
            assert set(monitor_of(client).job_ids()) == {"job-new"}
    finally:
        store.close()
