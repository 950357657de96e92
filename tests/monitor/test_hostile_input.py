"""Numbers that cannot be answered, padding and replay: refused at ingest, never stored, never a 500."""

from __future__ import annotations

import json
import sqlite3
import time
import zlib
from pathlib import Path

import httpx
import pytest
from monitor_reports import progress, rank, report
from monitor_testkit import TestClient, assert_refused, monitor_of
from real_monitor import running_monitor

from monitor.store import Store

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
