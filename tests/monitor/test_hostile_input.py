"""Numbers that cannot be answered, padding and replay: refused at ingest, never stored, never a 500."""

from __future__ import annotations

import json
import sqlite3
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from monitor_reports import progress, rank, report
from monitor_testkit import FakeClock, TestClient, assert_refused, monitor_of
from real_monitor import running_monitor

from monitor.web.app import create_app
from monitor.ingest.fastwire import decode_report
from monitor.ingest.limits import Limits, check_report
from monitor.web.settings import Settings
from monitor.storage.store import Store, open_store

URL = "/api/v1/reports"


def _raw(rank_fields: str) -> bytes:
    """A report whose one rank carries ``rank_fields`` as raw JSON text (json.dumps cannot write 1e999)."""
    return (f'{{"schema_version": 1, "node": "node-a", "sent_at": 1.0, "ranks": [{{"job_id": "job-a", "rank": 0, '
            f'"world_size": 2, "pid": 10, {rank_fields}}}]}}').encode()


@pytest.mark.parametrize(("fields", "where"), [
    ('"cpu_percent": NaN', "ranks.0.cpu_percent"),
    ('"cpu_percent": Infinity', "ranks.0.cpu_percent"),
    ('"cpu_percent": -Infinity', "ranks.0.cpu_percent"),
    ('"cpu_percent": 1e999', "ranks.0.cpu_percent"),
    ('"cpu_seconds": 1e301', "ranks.0.cpu_seconds"),
    ('"progress": {"step": ' + "1" + "0" * 400 + "}", "ranks.0.progress.step"),
    ('"wchar": -' + "9" * 30, "ranks.0.wchar"),
    ('"progress": {"recent": [[NaN, 3]]}', "ranks.0.progress.recent.0.0"),
])
def test_numbers_no_answer_could_carry_are_refused(client: TestClient, store: Store, fields: str, where: str) -> None:
    assert_refused(client, _raw(fields), where)
    assert monitor_of(client).reports_total == 0
    assert store.count_snapshots() == 0
    assert client.get("/diagnose", params={"format": "json"}).status_code == 200


def test_only_validated_fields_are_stored(client: TestClient, store: Store) -> None:
    padded = report(ranks=[rank(padding="x" * 40_000, cpu_percent=50.0)], padding="y" * 20_000)
    assert client.post(URL, json=padded).status_code == 202
    [stored] = store.recent_snapshots(0)
    kept = json.loads(stored.body)
    assert "padding" not in kept and "padding" not in kept["ranks"][0]
    assert kept["ranks"][0]["cpu_percent"] == 50.0
    assert len(stored.body) < 4_000


def _store_raw_snapshot(db: Path, body: bytes) -> None:
    """A snapshot as an older monitor stored it: the body as received, NaN included."""
    Store(db).close()  # creates the schema
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO snapshots (node, received_at, body) VALUES (?, ?, ?)",
                     ("node-a", time.time(), zlib.compress(body)))


def test_a_stored_report_no_answer_could_carry_is_skipped_on_replay(tmp_path: Path) -> None:
    db = tmp_path / "state" / "monitor.db"
    db.parent.mkdir()
    good = report(node="node-b", ranks=[rank(job_id="job-b", progress=progress(5, step=5))], sent_at=time.time())
    with running_monitor(tmp_path, db=db) as monitor:
        assert httpx.post(monitor.base + URL, json=good, timeout=5).status_code == 202
        bad = _raw('"cpu_percent": NaN, "progress": {"step": ' + "1" + "0" * 400 + "}")
        assert httpx.post(monitor.base + URL, content=bad, headers={"content-type": "application/json"},
                          timeout=5).status_code == 422
    _store_raw_snapshot(db, bad)
    with running_monitor(tmp_path, db=db) as monitor:
        answer = httpx.get(monitor.base + "/diagnose", params={"format": "json"}, timeout=5)
        assert answer.status_code == 200, answer.text
        assert [j["job_id"] for j in answer.json()["jobs"]] == ["job-b"]
        assert httpx.get(monitor.base + "/metrics", timeout=5).status_code == 200
        assert httpx.get(monitor.base + "/diagnose", timeout=5).status_code == 200
        assert "no longer validates" in monitor.log_text()


def _limits_report(node: str, *job_ids: str, world_size: int = 2) -> Any:
    return decode_report(json.dumps(report(node=node, ranks=[rank(job_id=j, rank=i, world_size=world_size)
                                                             for i, j in enumerate(job_ids)])))


@pytest.mark.parametrize(("node", "job_ids", "world_size", "expected"), [
    ("node-a", ("job-a",), 2, None),
    ("node-a", ("job-a", "job-b"), 65536, None),
    ("node-new", ("job-a",), 2, None),  # two nodes known, room for a third
    ("node-a", ("job-c",), 2, None),  # job-c is a spelling of job-a
    ("node-a", ("job-a",), 65537, (422, "world_size")),
    ("node-a", ("job-new", "job-newer"), 2, (429, "too_many_jobs")),
    ("node-a", ("job-a", "job-new"), 2, None),
    ("node-b", ("job-a", "job-b", "job-c", "job-d", "job-e"), 2, (429, "node_jobs")),  # one node's share
])
def test_limits_on_what_one_monitor_takes_in(node: str, job_ids: tuple[str, ...], world_size: int,
                                             expected: tuple[int, str] | None) -> None:
    limits = Limits(max_jobs=3, max_nodes=3, max_world_size=65536, max_jobs_per_node=3)
    refusal = check_report(_limits_report(node, *job_ids, world_size=world_size), limits,
                           jobs={"job-a", "job-b"}, nodes={"node-a", "node-b"},
                           canonical=lambda j: {"job-c": "job-a"}.get(j, j))
    assert (refusal.status, refusal.reason) == expected if expected else refusal is None


@pytest.mark.parametrize(("ranks", "expected"), [
    ((("job-a", 0), ("job-a", 1)), None),  # held already
    ((("job-a", 2),), None),  # the fourth of four
    ((("job-a", 2), ("job-a", 3)), (429, "too_many_ranks")),
    ((("job-new", 0), ("job-new", 1)), (429, "too_many_ranks")),
    ((("job-b", 0), ("job-c", 5)), None),  # job-c is a spelling of job-a: one new rank
])
def test_all_jobs_ranks_together_are_bounded(ranks: tuple[tuple[str, int], ...], expected: tuple[int, str] | None) -> None:
    held = {"job-a": {0, 1}, "job-b": {0}}
    decoded = decode_report(json.dumps(report(node="node-a", ranks=[rank(job_id=j, rank=r) for j, r in ranks])))
    refusal = check_report(decoded, Limits(max_ranks=4), jobs=held.keys(), nodes={"node-a"},
                           canonical=lambda j: {"job-c": "job-a"}.get(j, j),
                           known_ranks=lambda job: held.get(job, ()), ranks_total=lambda: sum(map(len, held.values())))
    assert (refusal.status, refusal.reason) == expected if expected else refusal is None


def test_a_monitor_full_of_nodes_refuses_a_new_one() -> None:
    refusal = check_report(_limits_report("node-c", "job-a"), Limits(max_nodes=2), jobs={"job-a"},
                           nodes={"node-a", "node-b"}, canonical=lambda j: j)
    assert refusal is not None and (refusal.status, refusal.reason) == (429, "too_many_nodes")


def test_junk_jobs_past_the_limit_are_refused_and_real_ones_go_on(tmp_path: Path) -> None:
    env = {"HANGWATCH_MAX_JOBS": "3", "HANGWATCH_MAX_WORLD_SIZE": "1024"}
    with running_monitor(tmp_path, extra_env=env) as monitor:
        url = monitor.base + URL
        real = report(node="node-real", ranks=[rank(job_id="job-real")])
        assert httpx.post(url, json=real, timeout=5).status_code == 202
        statuses = [httpx.post(url, json=report(node=f"junk-{i}", ranks=[rank(job_id=f"junk-{i}")]),
                               timeout=5).status_code for i in range(20)]
        assert statuses[:2] == [202, 202] and set(statuses[2:]) == {429}
        assert httpx.post(url, json=real, timeout=5).status_code == 202
        huge = report(node="node-real", ranks=[rank(job_id="job-real", world_size=1_000_000 - 1)])
        answer = httpx.post(url, json=huge, timeout=5)
        assert answer.status_code == 422 and "max_world_size" in answer.json()["detail"]
        jobs = httpx.get(monitor.base + "/diagnose", params={"format": "json"}, timeout=5).json()["jobs"]
        assert sorted(j["job_id"] for j in jobs) == ["job-real", "junk-0", "junk-1"]
        assert [j["world_size"] for j in jobs if j["job_id"] == "job-real"] == [2]
        metrics = httpx.get(monitor.base + "/metrics", timeout=5).text
        assert 'hangwatch_reports_rejected_total{reason="too_many_jobs"} 18.0' in metrics
        assert 'hangwatch_reports_rejected_total{reason="world_size"} 1.0' in metrics


def test_a_full_monitor_lets_a_new_node_in_by_forgetting_the_longest_silent_one(
    db_path: Path, clock: FakeClock
) -> None:
    """Silent nodes are kept (for their alert) but never at the cost of a live one: once silent
    past the job retention, the longest-silent one makes room; before that, the new node waits."""
    settings = Settings.from_raw({"db": db_path, "tick_interval_s": 0, "max_nodes": 2, "job_retention_s": 60})
    store = open_store(settings, clock)
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            def post(node: str) -> int:
                body = report(node=node, ranks=[rank(job_id=f"job-{node}")], sent_at=clock.now)
                return client.post(URL, json=body).status_code

            assert post("node-a") == 202
            clock.advance(10)
            assert post("node-b") == 202
            clock.advance(30)
            assert post("node-c") == 429  # node-a silent 40 s: within the retention, kept
            clock.advance(30)
            assert post("node-b") == 202  # node-b speaks again; node-a is silent 70 s now
            assert post("node-c") == 202
            nodes = set(monitor_of(client).node_ids())
            assert nodes == {"node-b", "node-c"}
    finally:
        store.close()
