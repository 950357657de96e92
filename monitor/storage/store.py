"""SQLite persistence: node snapshots (for replay after a restart) and verdict changes.

Not every report is stored: at 10,000 ranks that is megabytes a second for nothing. Each
node's full report is kept as a snapshot at most once per snapshot interval (the monitor
asks agents for one when due), the newest few per node, compressed; a restart replays them.
Verdict changes are the job's history and are kept for ``verdict_retention_s``.
The database's size is thus bounded by configuration: snapshots take at most
``snapshot_budget_bytes`` (each node's at most snapshots per node x ``snapshot_max_bytes``, compressed;
a larger one is not kept; past the budget only nodes that already have a snapshot may replace it, so
junk sent under ever new node names cannot push out the real nodes'), plus the verdict changes
and action records of the retention period. No snapshot is written while the database's volume has
less than ``min_free_bytes`` free (monitor/storage/free_space.py): the ones kept stay, and the room
left goes to the verdict history.

Writes go through one writer thread fed by a queue, so a slow disk never stalls
the event loop and SQLite sees a single writer; whatever is queued is committed in one
transaction. Reads use their own connection and first wait for queued writes, so a read
always sees what was accepted before it.

The disk may fail under it: full, read-only, locked by another process. Then nothing stops:
verdict changes are held in memory (and merged into every read) and written once the database
takes writes again, tried every RETRY_S; snapshots are dropped (they only serve a replay);
``health`` says what is wrong for /metrics and /diagnose, and the log says it once a minute.
A database that cannot be opened at all (or is from a newer hangwatch: store_schema.py) is
replaced by one in memory, so a bad disk never turns into a restart loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hangwatch_common.settings import setting
from monitor.storage.free_space import MIN_FREE_BYTES, FreeSpace, VolumeSpace
from monitor.storage.store_schema import NewerSchema, migrate

log = logging.getLogger("hangwatch.monitor.store")

# How long a connection waits for a lock another process holds: short, so a locked database
# turns into a counted failure at once rather than a queue of writes and a 45-second read.
WRITE_BUSY_S = 2.0
READ_BUSY_S = 1.0
# While writes fail, the database is tried again this often (not on every batch).
RETRY_S = 5.0
# Verdict changes kept in memory while they cannot be written; snapshots queued at most.
MAX_UNSAVED = 10_000
MAX_QUEUED = 5_000
# Snapshot bodies waiting for the writer, in bytes: past this a snapshot is dropped. Bounds the
# memory they hold (5,000 padded 8-MiB reports would be 40 GiB) and how long a read, which waits
# for queued writes, waits behind them (a flood of padded reports made /metrics take over 30 s).
MAX_QUEUED_SNAPSHOT_BYTES = 32 * 1024 * 1024
FAILURE_LOG_EVERY_S = 60.0


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
    # The nodes the culprit ranks ran on when the change was published (monitor/engine/incidents.py).
    culprit_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActionRecord:
    """One entry of the actions' audit log (monitor/engine/actions/): what a rule did about an incident."""

    at: float
    job_id: str
    incident_started_at: float
    rule: str
    kind: str  # command, webhook, signal
    verdict: str
    culprit_ranks: tuple[int, ...]
    culprit_nodes: tuple[str, ...]
    target: str  # the command line, the webhook, the signal
    outcome: str  # ok, failed, dry_run, rate_limited, unattributed, skipped, refused
    detail: str


_CHANGE_COLUMNS = "job_id, at, verdict, culprits, summary, culprit_nodes"
_ACTION_COLUMNS = ("at, job_id, incident_started_at, rule, kind, verdict, culprits, culprit_nodes, target, outcome, "
                   "detail")
_Write = Callable[[sqlite3.Connection], None]
_STOP = object()


@dataclass(frozen=True)
class _Queued:
    kind: str  # "snapshot", "verdict", "action", "prune"
    write: _Write
    change: VerdictChange | None = None
    size: int = 0  # a snapshot's body bytes


@dataclass(frozen=True)
class StoreSettings:
    """The monitor's settings of these names (monitor/web/settings.py inherits them), declared here."""

    snapshot_retention_s: float = setting(900.0, help="seconds a snapshot is kept (and only the newest few per node)",
                                          positive=True)
    snapshots_per_node: int = setting(3, help="snapshots kept per node", at_least=1)
    # Past the budget only nodes that have a snapshot may replace theirs.
    snapshot_max_bytes: int = setting(1024 * 1024, help="largest snapshot kept (compressed)", at_least=1024)
    snapshot_budget_bytes: int = setting(1024 * 1024 * 1024, help="all snapshots together at most", at_least=1024)
    verdict_retention_s: float = setting(30 * 86400.0, help="seconds verdict changes (each job's history) are kept",
                                         positive=True)
    # monitor/storage/free_space.py: the expendable writes stop first, leaving room for the verdict history.
    min_free_bytes: int = setting(MIN_FREE_BYTES, help="captures and snapshots are not written while their volume has "
                                  "less free space than this (counted, logged, and /readyz says so); 0: never checked",
                                  at_least=0)


@dataclass
class StoreHealth:
    """Whether what the monitor learns reaches the disk; shown on /metrics and /diagnose."""

    ok: bool = True
    # Why not, in a few words ("disk full: database or disk is full"), and since when.
    problem: str | None = None
    since: float | None = None
    # The database could not be opened: everything lives in memory until a restart.
    in_memory: bool = False
    write_failures: dict[str, int] = field(default_factory=dict)
    snapshots_dropped: int = 0  # the database failing or far behind
    snapshots_too_large: int = 0  # over snapshot_max_bytes compressed
    snapshots_over_budget: int = 0  # a new node's, while snapshots fill snapshot_budget_bytes
    snapshots_low_space: int = 0  # the volume under min_free_bytes free
    unsaved_dropped: int = 0


@dataclass(frozen=True)
class StoreFigures:
    """The database's state (``StoreHealth``) and queues, copied at one moment (``Store.figures``)."""

    ok: bool
    problem: str | None
    in_memory: bool
    write_failures: tuple[tuple[str, int], ...]
    snapshots_written: int
    snapshots_dropped: int
    snapshots_too_large: int
    snapshots_over_budget: int
    snapshots_low_space: int
    snapshot_bytes: int | None
    backlog: int
    unsaved: int


def failure_reason(exc: BaseException) -> str:
    """A short name for a database failure, a label of hangwatch_monitor_store_write_failures."""
    text = str(exc).lower()
    for needle, reason in (("full", "disk_full"), ("readonly", "read_only"), ("read-only", "read_only"),
                           ("locked", "locked"), ("busy", "locked"), ("i/o", "io_error")):
        if needle in text:
            return reason
    return "error"


class Store:
    def __init__(
        self,
        path: Path | str,
        settings: StoreSettings | None = None,
        *,
        prune_every_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        **tuning: Any,
    ) -> None:
        """``settings``: the retention and budgets as declared (``StoreSettings``); ``tuning``: settings of
        those names replaced (``snapshots_per_node=1``)."""
        settings = settings if settings is not None else StoreSettings()
        if tuning:
            settings = dataclasses.replace(settings, **tuning)
        snapshot_retention_s, snapshots_per_node = settings.snapshot_retention_s, settings.snapshots_per_node
        verdict_retention_s = settings.verdict_retention_s
        snapshot_max_bytes, snapshot_budget_bytes = settings.snapshot_max_bytes, settings.snapshot_budget_bytes
        self.path = Path(path)
        self.snapshot_max_bytes = snapshot_max_bytes
        self.snapshot_budget_bytes = snapshot_budget_bytes
        self._snapshot_bytes: int | None = None  # all snapshots' compressed bytes (writer thread)
        self.snapshot_retention_s = snapshot_retention_s
        self.snapshots_per_node = snapshots_per_node
        self.verdict_retention_s = verdict_retention_s
        self._prune_every_s = prune_every_s
        self._clock = clock
        self.health = StoreHealth()
        self._unsaved: list[VerdictChange] = []
        self._unsaved_lock = threading.Lock()
        self._last_attempt = 0.0
        self._last_failure_log = 0.0
        self._target: str = str(self.path)
        # None: the database lives in memory, there is no volume to watch.
        self.free_space: FreeSpace | None = FreeSpace("store", self.path.parent, settings.min_free_bytes)
        try:
            self._reader = self._connect(self._target, READ_BUSY_S)
            migrate(self._reader)
        except (sqlite3.Error, OSError, NewerSchema) as exc:
            # Never a crash loop over a disk problem: serve from memory, say so loudly.
            log.error("cannot use the database %s (%s): keeping history in memory only; it will not survive "
                      "a restart", self.path, exc)
            self._target = f"file:hangwatch-{id(self)}?mode=memory&cache=shared"
            self._reader = self._connect(self._target, READ_BUSY_S)
            migrate(self._reader)
            self.health = StoreHealth(ok=False, problem=f"cannot open the database: {exc}", since=clock(),
                                      in_memory=True)
            self.free_space = None
        self._reader_lock = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue()
        self._queued_snapshot_bytes = 0
        self._queued_lock = threading.Lock()
        self._error: BaseException | None = None
        self.snapshots_written = 0
        self._writer = threading.Thread(target=self._write_loop, name="hangwatch-store", daemon=True)
        self._writer.start()
        self._closed = False

    def _connect(self, target: str, busy_s: float) -> sqlite3.Connection:
        memory = target.startswith("file:")
        conn = sqlite3.connect(target, check_same_thread=False, timeout=busy_s, uri=memory)
        if not memory:
            conn.execute("PRAGMA journal_mode=WAL")
        # WAL with NORMAL survives a process crash; only an OS crash can lose the last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    # --- writes (queued) ---

    def add_snapshot(self, node: str, received_at: float, body: bytes | str) -> None:
        """Keep ``body`` (a validated full report) as the node's newest snapshot."""
        raw = body.encode() if isinstance(body, str) else body
        if self._queue.qsize() >= MAX_QUEUED or self._queued_snapshot_bytes + len(raw) > MAX_QUEUED_SNAPSHOT_BYTES:
            # The disk is far behind (or failing): a snapshot is only for replay, the next will do.
            self.health.snapshots_dropped += 1
            return
        with self._queued_lock:
            self._queued_snapshot_bytes += len(raw)

        def write(c: sqlite3.Connection) -> None:
            # Compressed here, on the writer thread: zlib releases the GIL, the event loop does not wait.
            blob = zlib.compress(raw, 1)
            if len(blob) > self.snapshot_max_bytes:
                self.health.snapshots_too_large += 1
                return
            if self.free_space is not None and self.free_space.refuses("snapshots", len(blob)):
                # The stored snapshots stay: a replay uses the ones already kept.
                self.health.snapshots_low_space += 1
                return
            total = self._stored_snapshot_bytes(c)
            if total + len(blob) > self.snapshot_budget_bytes:
                own_bytes, own_count = c.execute(
                    "SELECT COALESCE(SUM(length(body)), 0), COUNT(*) FROM snapshots WHERE node = ?", (node,)).fetchone()
                if not own_count:
                    self.health.snapshots_over_budget += 1
                    return
                # The node replaces what it has: its footprint does not grow while the budget is full.
                c.execute("DELETE FROM snapshots WHERE node = ?", (node,))
                total -= own_bytes
            c.execute("INSERT INTO snapshots (node, received_at, body) VALUES (?, ?, ?)", (node, received_at, blob))
            self._snapshot_bytes = total + len(blob)
            self.snapshots_written += 1

        self._submit(_Queued("snapshot", write, size=len(raw)))

    def add_verdict(self, change: VerdictChange) -> None:
        self._submit(_Queued("verdict", lambda c: _insert_verdict(c, change), change))

    def add_action(self, record: ActionRecord) -> None:
        def write(c: sqlite3.Connection) -> None:
            c.execute(f"INSERT INTO actions ({_ACTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (record.at, record.job_id, record.incident_started_at, record.rule, record.kind, record.verdict,
                       json.dumps(list(record.culprit_ranks)), json.dumps(list(record.culprit_nodes)), record.target,
                       record.outcome, record.detail))

        self._submit(_Queued("action", write))

    def prune(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        self._submit(_Queued("prune", lambda c: self._prune(c, now)))

    def flush(self) -> None:
        """Wait until every queued write is committed (or, failing, kept in memory)."""
        self._queue.join()

    def figures(self) -> StoreFigures:
        """What /metrics and /diagnose show of the store. The writer thread moves these as it goes: each
        is read once, a copy of its own (``dict()`` of the failures: one step under the GIL)."""
        health = self.health
        return StoreFigures(
            ok=health.ok, problem=health.problem, in_memory=health.in_memory,
            write_failures=tuple(sorted(dict(health.write_failures).items())),
            snapshots_written=self.snapshots_written, snapshots_dropped=health.snapshots_dropped,
            snapshots_too_large=health.snapshots_too_large, snapshots_over_budget=health.snapshots_over_budget,
            snapshots_low_space=health.snapshots_low_space, snapshot_bytes=self.snapshot_bytes, backlog=self.backlog, unsaved=self.unsaved)

    def volume(self) -> VolumeSpace | None:
        """The database's volume now (None: in memory, or unreadable)."""
        return self.free_space.reading() if self.free_space is not None else None

    @property
    def backlog(self) -> int:
        """Writes queued and not yet committed."""
        return self._queue.qsize()

    @property
    def unsaved(self) -> int:
        """Verdict changes held in memory because the database would not take them."""
        return len(self._unsaved)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        with self._reader_lock:
            self._reader.close()

    def _submit(self, item: _Queued) -> None:
        if self._closed:
            raise RuntimeError("store is closed")
        self._queue.put(item)

    def _write_loop(self) -> None:
        conn = self._connect(self._target, WRITE_BUSY_S)
        last_prune = 0.0
        try:
            while True:
                writable = self.health.ok or self.health.in_memory
                try:
                    # While failing, wake up to try the disk again even when nothing new comes.
                    item = self._queue.get(timeout=None if writable else RETRY_S)
                    batch = [item]
                except queue.Empty:
                    item, batch = None, []
                # Commit whatever is already waiting in one transaction.
                while batch and item is not _STOP:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    batch.append(item)
                writes = [i for i in batch if isinstance(i, _Queued)]
                try:
                    if writable or self._clock() - self._last_attempt >= RETRY_S:
                        self._last_attempt = self._clock()
                        last_prune = self._commit(conn, writes, last_prune)
                    else:
                        self._hold(writes)  # failing: try the disk again every RETRY_S only
                finally:
                    done = sum(i.size for i in writes)
                    if done:
                        with self._queued_lock:
                            self._queued_snapshot_bytes -= done
                    for _ in batch:
                        self._queue.task_done()
                if any(i is _STOP for i in batch):
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, writes: list[_Queued], last_prune: float) -> float:
        """One transaction: the changes held in memory first, then this batch."""
        with self._unsaved_lock:
            held = list(self._unsaved)
        try:
            with conn:
                for change in held:
                    _insert_verdict(conn, change)
                for item in writes:
                    item.write(conn)
                if self._clock() - last_prune >= self._prune_every_s:
                    last_prune = self._clock()
                    self._prune(conn, last_prune)
        except sqlite3.Error as exc:
            self._error = exc
            self._snapshot_bytes = None  # rolled back: counted afresh
            self._failed(exc)
            self._hold(writes)
            return last_prune
        if held:
            with self._unsaved_lock:
                del self._unsaved[:len(held)]
        if not self.health.ok and not self.health.in_memory:
            log.warning("database %s writable again: %d verdict changes held in memory are written",
                        self.path, len(held))
            self.health.ok, self.health.problem, self.health.since = True, None, None
        return last_prune

    def _hold(self, writes: list[_Queued]) -> None:
        """Writes the database would not take: verdict changes stay in memory, the rest is dropped."""
        with self._unsaved_lock:
            for item in writes:
                if item.change is not None:
                    self._unsaved.append(item.change)
                elif item.kind == "snapshot":
                    self.health.snapshots_dropped += 1
            overflow = len(self._unsaved) - MAX_UNSAVED
            if overflow > 0:
                del self._unsaved[:overflow]
                self.health.unsaved_dropped += overflow

    def _failed(self, exc: BaseException) -> None:
        reason = failure_reason(exc)
        health = self.health
        health.write_failures[reason] = health.write_failures.get(reason, 0) + 1
        now = self._clock()
        if health.ok:
            health.ok, health.since = False, now
        health.problem = f"{reason.replace('_', ' ')}: {exc}"
        if now - self._last_failure_log >= FAILURE_LOG_EVERY_S:
            self._last_failure_log = now
            log.error("cannot write the database %s (%s): %d verdict changes held in memory, snapshots "
                      "dropped; retrying every %.0fs", self.path, exc, len(self._unsaved), RETRY_S)

    @property
    def snapshot_bytes(self) -> int | None:
        """The stored snapshots' compressed bytes, as the writer last counted them (None: not yet)."""
        return self._snapshot_bytes

    def _stored_snapshot_bytes(self, conn: sqlite3.Connection) -> int:
        if self._snapshot_bytes is None:
            # length() of a blob reads its size from the record header, not the blob.
            self._snapshot_bytes = conn.execute("SELECT COALESCE(SUM(length(body)), 0) FROM snapshots").fetchone()[0]
        return self._snapshot_bytes

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        conn.execute("DELETE FROM snapshots WHERE received_at < ?", (now - self.snapshot_retention_s,))
        conn.execute(
            "DELETE FROM snapshots WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
            "(PARTITION BY node ORDER BY id DESC) AS newer FROM snapshots) WHERE newer > ?)",
            (self.snapshots_per_node,),
        )
        self._snapshot_bytes = None  # counted afresh (a failed transaction may have left it off)
        conn.execute("DELETE FROM verdicts WHERE at < ?", (now - self.verdict_retention_s,))
        conn.execute("DELETE FROM actions WHERE at < ?", (now - self.verdict_retention_s,))

    @property
    def last_error(self) -> BaseException | None:
        return self._error

    # --- reads ---

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Rows, or none when the database cannot be read now (locked, gone): logged, never raised."""
        try:
            with self._reader_lock:
                return self._reader.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            log.warning("cannot read the database %s (%s): answering from memory", self.path, exc)
            return []

    def recent_snapshots(self, since: float) -> Iterator[StoredReport]:
        """Snapshots taken after ``since``, oldest first, each node capped to its newest N."""
        self.flush()
        rows = self._read(
            "SELECT node, received_at, body FROM (SELECT node, received_at, body, id, ROW_NUMBER() OVER "
            "(PARTITION BY node ORDER BY id DESC) AS newer FROM snapshots WHERE received_at >= ?) "
            "WHERE newer <= ? ORDER BY received_at, id",
            (since, self.snapshots_per_node),
        )
        for node, received_at, body in rows:
            # Rows migrated from the old ``reports`` table are uncompressed text.
            yield StoredReport(node, received_at, body.encode() if isinstance(body, str) else zlib.decompress(body))

    def verdict_history(self, job_id: str, limit: int = 500) -> list[VerdictChange]:
        self.flush()
        rows = self._read(
            # By time, not by row: changes an agent delivered after an outage come in late.
            f"SELECT {_CHANGE_COLUMNS} FROM verdicts WHERE job_id = ? ORDER BY at DESC, id DESC LIMIT ?",
            (job_id, limit),
        )
        stored = [_change(row) for row in rows]
        with self._unsaved_lock:
            held = [c for c in self._unsaved if c.job_id == job_id]
        return sorted(stored + held, key=lambda c: c.at)[-limit:]

    def latest_verdicts(self) -> dict[str, VerdictChange]:
        """The last recorded verdict of every job, so a restart does not record it again."""
        self.flush()
        rows = self._read(
            f"SELECT {_CHANGE_COLUMNS} FROM verdicts WHERE id IN (SELECT MAX(id) FROM verdicts GROUP BY job_id)"
        )
        latest = {change.job_id: change for change in map(_change, rows)}
        with self._unsaved_lock:
            for change in self._unsaved:
                latest[change.job_id] = change
        return latest

    def changes_since(self, since: float, limit: int = 200_000) -> list[VerdictChange]:
        """Every job's verdict changes at or after ``since`` (the newest ``limit``), oldest first."""
        self.flush()
        rows = self._read(
            f"SELECT {_CHANGE_COLUMNS} FROM verdicts WHERE at >= ? ORDER BY at DESC, id DESC LIMIT ?", (since, limit))
        stored = [_change(row) for row in rows]
        with self._unsaved_lock:
            held = [c for c in self._unsaved if c.at >= since]
        return sorted(stored + held, key=lambda c: c.at)

    def actions(self, job_id: str | None = None, limit: int = 500) -> list[ActionRecord]:
        """The audit log, newest last: one job's entries, or every job's."""
        self.flush()
        where, params = ("WHERE job_id = ?", (job_id, limit)) if job_id is not None else ("", (limit,))
        rows = self._read(f"SELECT {_ACTION_COLUMNS} FROM actions {where} ORDER BY at DESC, id DESC LIMIT ?", params)
        return [ActionRecord(at, job, started, rule, kind, verdict, tuple(json.loads(ranks)), tuple(json.loads(nodes)),
                             target, outcome, detail)
                for at, job, started, rule, kind, verdict, ranks, nodes, target, outcome, detail in reversed(rows)]

    def count_snapshots(self) -> int:
        self.flush()
        rows = self._read("SELECT COUNT(*) FROM snapshots")
        return int(rows[0][0]) if rows else 0


def _insert_verdict(conn: sqlite3.Connection, change: VerdictChange) -> None:
    conn.execute("INSERT INTO verdicts (job_id, at, verdict, culprits, summary, culprit_nodes) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 (change.job_id, change.at, change.verdict, json.dumps(list(change.culprit_ranks)), change.summary,
                  json.dumps(list(change.culprit_nodes))))


def _change(row: tuple) -> VerdictChange:
    job_id, at, verdict, culprits, summary, nodes = row
    return VerdictChange(job_id, at, verdict, tuple(json.loads(culprits)), summary, tuple(json.loads(nodes)))


def open_store(settings: Any, clock: Callable[[], float] = time.time) -> Store:
    """The store with the retention ``settings`` (a ``monitor.web.settings.Settings``) asks for."""
    return Store(settings.db, settings, clock=clock)
