"""The database's schema, versioned in ``PRAGMA user_version``, and the steps from each version.

Each migration runs once, in order, in one transaction with the version bump, so a monitor
killed half-way leaves the database at the version before. A database from a newer monitor
(its version above ``SCHEMA_VERSION``) is not touched: ``NewerSchema``.
"""

from __future__ import annotations

import sqlite3

# Version 1: snapshots and verdicts (databases from before versions had them, or an older
# ``reports`` table, which becomes snapshots). Version 2: history read by time.
_V1 = """
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
_V1_FROM_REPORTS = """
INSERT INTO snapshots (node, received_at, body)
    SELECT node, received_at, body FROM reports WHERE id IN (SELECT MAX(id) FROM reports GROUP BY node);
DROP TABLE reports;
"""
# Changes delivered late (after an agent's outage) are read in time order, not row order.
_V2 = "CREATE INDEX IF NOT EXISTS verdicts_by_job_time ON verdicts (job_id, at);"

# Version 3: each change names its culprits' nodes (monitor/engine/incidents.py: suspect nodes).
_V3 = "ALTER TABLE verdicts ADD COLUMN culprit_nodes TEXT NOT NULL DEFAULT '[]'"

# Version 4: the audit log of opt-in actions (monitor/engine/actions/): what each rule did, or why not.
_V4 = """
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    job_id TEXT NOT NULL,
    incident_started_at REAL NOT NULL,
    rule TEXT NOT NULL,
    kind TEXT NOT NULL,
    verdict TEXT NOT NULL,
    culprits TEXT NOT NULL,
    culprit_nodes TEXT NOT NULL,
    target TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS actions_by_job ON actions (job_id, at);
CREATE INDEX IF NOT EXISTS actions_by_time ON actions (at)
"""

SCHEMA_VERSION = 4


class NewerSchema(Exception):
    def __init__(self, found: int) -> None:
        super().__init__(f"the database is at schema version {found}, from a newer hangwatch "
                         f"(this one knows up to {SCHEMA_VERSION}); not touching it")
        self.found = found


def _v1(conn: sqlite3.Connection) -> None:
    for statement in _V1.split(";"):
        if statement.strip():
            conn.execute(statement)
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reports'").fetchone():
        for statement in _V1_FROM_REPORTS.split(";"):
            if statement.strip():
                conn.execute(statement)


def _v2(conn: sqlite3.Connection) -> None:
    conn.execute(_V2)


def _v3(conn: sqlite3.Connection) -> None:
    conn.execute(_V3)


def _v4(conn: sqlite3.Connection) -> None:
    for statement in _V4.split(";"):
        if statement.strip():
            conn.execute(statement)


MIGRATIONS = ((1, _v1), (2, _v2), (3, _v3), (4, _v4))


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database to SCHEMA_VERSION; return the version it was at."""
    found = schema_version(conn)
    if found > SCHEMA_VERSION:
        raise NewerSchema(found)
    for version, step in MIGRATIONS:
        if version <= found:
            continue
        # The step and its version bump commit together (an explicit transaction: the sqlite3
        # module would otherwise run the DDL statements outside of one).
        conn.execute("BEGIN IMMEDIATE")
        try:
            step(conn)
            conn.execute(f"PRAGMA user_version = {version}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return found
