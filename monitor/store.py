"""SQLite persistence: accepted reports (for replay after a restart) and verdict changes.

Writes go through one writer thread fed by a queue, so a slow disk never stalls
the event loop and SQLite sees a single writer. Reads use their own connection
and first wait for queued writes, so a read always sees what was accepted before it.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    received_at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reports_by_node ON reports (node, id);
CREATE INDEX IF NOT EXISTS reports_by_time ON reports (received_at);
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    verdict TEXT NOT NULL,
    culprits TEXT NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS verdicts_by_job ON verdicts (job_id, id);
"""


@dataclass(frozen=True)
class StoredReport:
    node: str
    received_at: float
    body: str


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
        report_retention_s: float = 900.0,
        reports_per_node: int = 900,
        prune_every_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.report_retention_s = report_retention_s
        self.reports_per_node = reports_per_node
        self._prune_every_s = prune_every_s
        self._clock = clock
        self._reader = self._connect()
        self._reader.executescript(_SCHEMA)
        self._reader_lock = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue()
        self._error: BaseException | None = None
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

    def add_report(self, node: str, received_at: float, body: str) -> None:
        self._submit(
            lambda c: c.execute(
                "INSERT INTO reports (node, received_at, body) VALUES (?, ?, ?)", (node, received_at, body)
            )
        )

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
        conn.execute("DELETE FROM reports WHERE received_at < ?", (now - self.report_retention_s,))
        for (node,) in conn.execute("SELECT DISTINCT node FROM reports").fetchall():
            conn.execute(
                "DELETE FROM reports WHERE node = ? AND id <= "
                "(SELECT id FROM reports WHERE node = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (node, node, self.reports_per_node),
            )

    @property
    def last_error(self) -> BaseException | None:
        return self._error

    # --- reads ---

    def recent_reports(self, since: float) -> Iterator[StoredReport]:
        """Stored reports received after ``since``, oldest first, each node capped to its newest N."""
        self.flush()
        with self._reader_lock:
            rows = self._reader.execute(
                "SELECT node, received_at, body FROM reports r WHERE received_at >= ? AND id > COALESCE("
                "(SELECT id FROM reports WHERE node = r.node ORDER BY id DESC LIMIT 1 OFFSET ?), 0) "
                "ORDER BY received_at, id",
                (since, self.reports_per_node),
            ).fetchall()
        for node, received_at, body in rows:
            yield StoredReport(node, received_at, body)

    def verdict_history(self, job_id: str, limit: int = 500) -> list[VerdictChange]:
        self.flush()
        with self._reader_lock:
            rows = self._reader.execute(
                "SELECT job_id, at, verdict, culprits, summary FROM verdicts WHERE job_id = ? "
                "ORDER BY id DESC LIMIT ?",
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

    def count_reports(self) -> int:
        self.flush()
        with self._reader_lock:
            return int(self._reader.execute("SELECT COUNT(*) FROM reports").fetchone()[0])
