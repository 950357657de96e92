"""SQLite persistence: node snapshots (for replay after a restart) and verdict changes.

Not every report is stored: at 10,000 ranks that is megabytes a second for nothing. Each
node's full report is kept as a snapshot at most once per snapshot interval (the monitor
asks agents for one when due), the newest few per node, compressed; a restart replays them.
Verdict changes are the job's history and are kept for ``verdict_retention_s``.
The database's size is thus bounded by configuration: nodes x snapshots per node x a
compressed full report, plus the verdict changes of the retention period.

Writes go through one writer thread fed by a queue, so a slow disk never stalls
the event loop and SQLite sees a single writer; whatever is queued is committed in one
transaction. Reads use their own connection and first wait for queued writes, so a read
always sees what was accepted before it.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    received_at REAL NOT NULL,
    body BLOB NOT NULL  -- zlib-compressed report JSON
);
CREATE INDEX IF NOT EXISTS snapshots_by_node ON snapshots (node, id);
CREATE INDEX IF NOT EXISTS snapshots_by_time ON snapshots (received_at);
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    verdict TEXT NOT NULL,
    culprits TEXT NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS verdicts_by_job ON verdicts (job_id, id);
CREATE INDEX IF NOT EXISTS verdicts_by_time ON verdicts (at);
"""
# Databases written before snapshots kept every report in ``reports``: each node's newest
# becomes its snapshot, and the table goes.
_MIGRATE_REPORTS = """
INSERT INTO snapshots (node, received_at, body)
    SELECT node, received_at, body FROM reports WHERE id IN (SELECT MAX(id) FROM reports GROUP BY node);
DROP TABLE reports;
"""


@dataclass(frozen=True)
class StoredReport:
    node: str
    received_at: float
    body: bytes


@dataclass(frozen=True)
class VerdictChange:
    job_id: str
    at: float
    verdict: str
    culprit_ranks: tuple[int, ...]
    summary: str


_Write = Callable[[sqlite3.Connection], None]
_STOP = object()


class Store:
    def __init__(
        self,
        path: Path | str,
        snapshot_retention_s: float = 900.0,
        snapshots_per_node: int = 3,
        verdict_retention_s: float = 30 * 86400.0,
        prune_every_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.snapshot_retention_s = snapshot_retention_s
        self.snapshots_per_node = snapshots_per_node
        self.verdict_retention_s = verdict_retention_s
        self._prune_every_s = prune_every_s
        self._clock = clock
        self._reader = self._connect()
        self._reader.executescript(_SCHEMA)
        if self._reader.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reports'").fetchone():
            with self._reader:
                self._reader.executescript(_MIGRATE_REPORTS)
        self._reader_lock = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue()
        self._error: BaseException | None = None
        self.snapshots_written = 0
        self._writer = threading.Thread(target=self._write_loop, name="hangwatch-store", daemon=True)
        self._writer.start()
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0)
        conn.execute("PRAGMA journal_mode=WAL")
        # WAL with NORMAL survives a process crash; only an OS crash can lose the last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    # --- writes (queued) ---

    def add_snapshot(self, node: str, received_at: float, body: bytes | str) -> None:
        """Keep ``body`` (a full report as received) as the node's newest snapshot."""
        raw = body.encode() if isinstance(body, str) else body

        def write(c: sqlite3.Connection) -> None:
            # Compressed here, on the writer thread: zlib releases the GIL, the event loop does not wait.
            c.execute("INSERT INTO snapshots (node, received_at, body) VALUES (?, ?, ?)",
                      (node, received_at, zlib.compress(raw, 1)))
            self.snapshots_written += 1

        self._submit(write)

    def add_verdict(self, change: VerdictChange) -> None:
        self._submit(
            lambda c: c.execute(
                "INSERT INTO verdicts (job_id, at, verdict, culprits, summary) VALUES (?, ?, ?, ?, ?)",
                (change.job_id, change.at, change.verdict, json.dumps(list(change.culprit_ranks)), change.summary),
            )
        )

    def prune(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        self._submit(lambda c: self._prune(c, now))

    def flush(self) -> None:
        """Wait until every queued write is committed."""
        self._queue.join()

    @property
    def backlog(self) -> int:
        """Writes queued and not yet committed."""
        return self._queue.qsize()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        with self._reader_lock:
            self._reader.close()

    def _submit(self, write: _Write) -> None:
        if self._closed:
            raise RuntimeError("store is closed")
        self._queue.put(write)

    def _write_loop(self) -> None:
        conn = self._connect()
        last_prune = 0.0
        try:
            while True:
                item = self._queue.get()
                batch = [item]
                # Commit whatever is already waiting in one transaction.
                while item is not _STOP:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    batch.append(item)
                stop = any(i is _STOP for i in batch)
                try:
                    with conn:
                        for write in batch:
                            if write is not _STOP:
                                write(conn)  # type: ignore[operator]
                        if self._clock() - last_prune >= self._prune_every_s:
                            last_prune = self._clock()
                            self._prune(conn, last_prune)
                except sqlite3.Error as exc:
                    self._error = exc
                finally:
                    for _ in batch:
                        self._queue.task_done()
                if stop:
                    return
        finally:
            conn.close()

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        conn.execute("DELETE FROM snapshots WHERE received_at < ?", (now - self.snapshot_retention_s,))
        conn.execute(
            "DELETE FROM snapshots WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
            "(PARTITION BY node ORDER BY id DESC) AS newer FROM snapshots) WHERE newer > ?)",
            (self.snapshots_per_node,),
        )
        conn.execute("DELETE FROM verdicts WHERE at < ?", (now - self.verdict_retention_s,))

    @property
    def last_error(self) -> BaseException | None:
        return self._error

    # --- reads ---

    def recent_snapshots(self, since: float) -> Iterator[StoredReport]:
        """Snapshots taken after ``since``, oldest first, each node capped to its newest N."""
        self.flush()
        with self._reader_lock:
            rows = self._reader.execute(
                "SELECT node, received_at, body FROM (SELECT node, received_at, body, id, ROW_NUMBER() OVER "
                "(PARTITION BY node ORDER BY id DESC) AS newer FROM snapshots WHERE received_at >= ?) "
                "WHERE newer <= ? ORDER BY received_at, id",
                (since, self.snapshots_per_node),
            ).fetchall()
        for node, received_at, body in rows:
            # Rows migrated from the old ``reports`` table are uncompressed text.
            yield StoredReport(node, received_at, body.encode() if isinstance(body, str) else zlib.decompress(body))

    def verdict_history(self, job_id: str, limit: int = 500) -> list[VerdictChange]:
        self.flush()
        with self._reader_lock:
            rows = self._reader.execute(
                # By time, not by row: changes an agent delivered after an outage come in late.
                "SELECT job_id, at, verdict, culprits, summary FROM verdicts WHERE job_id = ? "
                "ORDER BY at DESC, id DESC LIMIT ?",
                (job_id, limit),
            ).fetchall()
        return [VerdictChange(j, at, v, tuple(json.loads(c)), s) for j, at, v, c, s in reversed(rows)]

    def latest_verdicts(self) -> dict[str, VerdictChange]:
        """The last recorded verdict of every job, so a restart does not record it again."""
        self.flush()
        with self._reader_lock:
            rows = self._reader.execute(
                "SELECT job_id, at, verdict, culprits, summary FROM verdicts "
                "WHERE id IN (SELECT MAX(id) FROM verdicts GROUP BY job_id)"
            ).fetchall()
        return {j: VerdictChange(j, at, v, tuple(json.loads(c)), s) for j, at, v, c, s in rows}

    def count_snapshots(self) -> int:
        self.flush()
        with self._reader_lock:
            return int(self._reader.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0])


def open_store(settings: Any, clock: Callable[[], float] = time.time) -> Store:
    """The store with the retention ``settings`` (a ``monitor.settings.Settings``) asks for."""
    return Store(settings.db, snapshot_retention_s=settings.snapshot_retention_s,
                 snapshots_per_node=settings.snapshots_per_node, verdict_retention_s=settings.verdict_retention_s,
                 clock=clock)
