"""A disk that fills up, turns read-only or is locked by another process: the real monitor keeps
answering, holds its history in memory, says so on /metrics and /diagnose, and writes it out once
the disk takes writes again. The disk is a small tmpfs mounted for the test (the tests run as root)."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import metric, running_monitor

from monitor.storage.store import failure_reason
from monitor.storage.store_schema import SCHEMA_VERSION
from tests.tmpfs import mounted_tmpfs

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

URL = "/api/v1/reports"


@pytest.fixture(autouse=True)
def _forget_latest() -> Iterator[None]:
    yield
    LATEST.clear()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", "4m") as mount:
        yield mount


# The node's latest report, posted again while a test waits: a node that stops reporting turns its
# job "unknown", which is another test's business.
LATEST: dict[str, tuple[str, dict]] = {}


def _until(check, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        for base, body in LATEST.values():
            httpx.post(base + URL, json=dict(body, sent_at=time.time()), timeout=5)
        time.sleep(0.2)


def _flip(base: str, job_id: str, n: int) -> None:
    """A verdict change: rank 1 alive (healthy) or gone (rank_exited), alternately."""
    gone = n % 2 == 1
    second = rank(job_id=job_id, rank=1, alive=not gone, pid=2000 + n,
                  **({"exit": {"at": time.time(), "code": 1, "source": "proc"}, "cpu_percent": None} if gone else {}))
    body = report(ranks=[rank(job_id=job_id, rank=0), second], sent_at=time.time())
    assert httpx.post(base + URL, json=body, timeout=5).status_code == 202
    LATEST[job_id] = (base, body)


def _history(base: str, job_id: str) -> list[str]:
    answer = httpx.get(f"{base}/api/v1/jobs/{job_id}/history", timeout=10)
    return [h["verdict"] for h in answer.json()["history"]] if answer.status_code == 200 else []


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, timeout=60)
    return filler


def test_a_full_disk_keeps_history_in_memory_and_writes_it_when_there_is_room(small_disk: Path,
                                                                              tmp_path: Path) -> None:
    env = {"HANGWATCH_TICK_INTERVAL_S": "0.2", "HANGWATCH_CONFIRM_ALARMS": "false"}
    with running_monitor(tmp_path, db=small_disk / "monitor.db", extra_env=env) as monitor:
        _flip(monitor.base, "job-d", 0)
        _until(lambda: _history(monitor.base, "job-d") == ["healthy"], 10, "no first verdict")
        filler = _fill(small_disk)
        for n in range(1, 6):
            _flip(monitor.base, "job-d", n)
            _until(lambda n=n: len(_history(monitor.base, "job-d")) == n + 1, 15, f"change {n} not in the history")
        _until(lambda: metric(monitor.base, "hangwatch_monitor_store_up") == 0, 15, "store_up never went to 0")
        assert (metric(monitor.base, "hangwatch_monitor_store_write_failures_total", reason="disk_full") or 0) >= 1
        assert (metric(monitor.base, "hangwatch_monitor_store_unsaved_changes") or 0) >= 1
        assert "database is not taking writes (disk full" in httpx.get(monitor.base + "/diagnose", timeout=5).text
        assert "cannot write the database" in monitor.log_text()
        filler.unlink()
        _until(lambda: metric(monitor.base, "hangwatch_monitor_store_up") == 1, 20, "never recovered")
        assert metric(monitor.base, "hangwatch_monitor_store_unsaved_changes") == 0
        assert monitor.proc.poll() is None
    conn = sqlite3.connect(small_disk / "monitor.db")
    stored = [v for (v,) in conn.execute("SELECT verdict FROM verdicts WHERE job_id = 'job-d' ORDER BY at")]
    conn.close()
    assert stored == ["healthy", "rank_exited"] * 3


def test_a_lock_held_by_another_process_does_not_stop_the_monitor(small_disk: Path, tmp_path: Path) -> None:
    # (A read-only remount under a running monitor cannot be made here: the kernel refuses to remount
    # a filesystem read-only while files on it are open for writing. Its SQLite error takes the same
    # path as these, see test_failures_are_named; a read-only disk at start is the test below.)
    env = {"HANGWATCH_TICK_INTERVAL_S": "0.2", "HANGWATCH_CONFIRM_ALARMS": "false"}
    db = small_disk / "monitor.db"
    with running_monitor(tmp_path, db=db, extra_env=env) as monitor:
        _flip(monitor.base, "job-r", 0)
        _until(lambda: _history(monitor.base, "job-r") == ["healthy"], 10, "no first verdict")
        _flip(monitor.base, "job-r", 1)
        _until(lambda: _history(monitor.base, "job-r") == ["healthy", "rank_exited"], 10, "no second verdict")

        locker = sqlite3.connect(db, timeout=5)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            for n in range(2, 5):
                _flip(monitor.base, "job-r", n)
                _until(lambda n=n: len(_history(monitor.base, "job-r")) == n + 1, 20, f"change {n} lost")
            _until(lambda: metric(monitor.base, "hangwatch_monitor_store_up") == 0, 20, "the lock went unnoticed")
            assert (metric(monitor.base, "hangwatch_monitor_store_write_failures_total", reason="locked") or 0) >= 1
            started = time.monotonic()
            history = _history(monitor.base, "job-r")
            assert time.monotonic() - started < 8, "a read waited on the lock"
            assert history == ["healthy", "rank_exited", "healthy", "rank_exited", "healthy"]
        finally:
            locker.rollback()
            locker.close()
        _until(lambda: metric(monitor.base, "hangwatch_monitor_store_up") == 1, 20, "never recovered from the lock")
        assert monitor.proc.poll() is None


@pytest.mark.parametrize("unusable", ["read-only disk", "newer schema"])
def test_a_database_it_cannot_open_is_no_crash_loop(small_disk: Path, tmp_path: Path, unusable: str) -> None:
    db = small_disk / "monitor.db"
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1 if unusable == 'newer schema' else 0}")
    conn.close()
    if unusable == "read-only disk":
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True, timeout=30)
    with running_monitor(tmp_path, db=db, extra_env={"HANGWATCH_CONFIRM_ALARMS": "false"}) as monitor:
        _flip(monitor.base, "job-m", 0)
        assert metric(monitor.base, "hangwatch_monitor_store_up") == 0
        assert metric(monitor.base, "hangwatch_monitor_store_in_memory") == 1
        _until(lambda: _history(monitor.base, "job-m") == ["healthy"], 10, "no history in memory")
        assert "keeping history in memory only" in monitor.log_text()
    if unusable == "newer schema":
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        conn.close()
    else:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True, timeout=30)


@pytest.mark.parametrize(("message", "reason"), [
    ("database or disk is full", "disk_full"),
    ("attempt to write a readonly database", "read_only"),
    ("database is locked", "locked"),
    ("disk I/O error", "io_error"),
    ("no such table: verdicts", "error"),
])
def test_failures_are_named(message: str, reason: str) -> None:
    assert failure_reason(sqlite3.OperationalError(message)) == reason
