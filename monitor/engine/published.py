"""What the engine publishes: immutable results, the only thing answers and /metrics read.

A diagnosis pass turns each job's live records (monitor/ingest/) into a ``JobResult`` and replaces
the job's previous one; the monitor's own figures are copied into ``MonitorFigures`` when asked.
Nothing here refers to a live record, so a route may hand a result to a worker thread, render it
while reports keep arriving, and keep it after the job is forgotten, without a lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from monitor.diagnosis import Diagnosis, JobView
from monitor.engine.job_names import job_names
from monitor.engine.readiness import Readiness
from monitor.storage.store import StoreFigures


@dataclass(frozen=True)
class RankConflict:
    """A rank another node claimed while its own node runs it (monitor/ingest/rank_claims.py)."""

    rank: int
    claimed_by: str
    held_by: str
    first_at: float
    last_at: float
    refused: int
    reason: str


@dataclass(frozen=True)
class JobResult:
    view: JobView
    diagnosis: Diagnosis
    last_report_at: float
    last_progress_at: float | None
    cpu_seconds: dict[int, float | None]
    # What hangs cost the job so far, by verdict (monitor/engine/hang_cost.py): rank-seconds, GPU-seconds.
    lost_rank_seconds: dict[str, float] = field(default_factory=dict)
    lost_gpu_seconds: dict[str, float] = field(default_factory=dict)
    # The same job as other nodes named it (a host name here, an address there), sorted.
    aliases: tuple[str, ...] = ()
    # (time, step) points of the job-scope logs, for ranks whose own logs show none.
    job_progress_points: tuple[tuple[float, int], ...] = ()
    rank_conflicts: tuple[RankConflict, ...] = ()

    @cached_property
    def names(self) -> dict[str, Any]:
        """What people call the job (monitor/engine/job_names.py): made once per diagnosis, for every
        answer and scrape that shows it (it reads every rank's environment)."""
        return job_names(self.view.job_id, (r.env for r in self.view.ranks))


@dataclass(frozen=True)
class NodeSummary:
    node: str
    last_report_at: float
    collectors: tuple[tuple[str, bool], ...]
    collector_errors: tuple[tuple[str, int], ...] = ()
    stack_failures: int = 0
    # The agent's own use (agent.selfwatch), when it reports it.
    agent_cpu_percent: float | None = None
    agent_rss_bytes: int | None = None


@dataclass(frozen=True)
class CaptureFigures:
    requested: int
    parts_received: int
    parts_refused: int
    total_bytes: int
    # Refused parts by reason (monitor/storage/capture_store.py REFUSAL_REASONS).
    refusals: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class MonitorStatus:
    """What every /diagnose answer says of the monitor itself: cheap to take on each read."""

    at: float
    nodes: int
    jobs: int
    last_pass_at: float | None
    last_pass_s: float
    # None while the database takes every write; else why not (history is held in memory).
    storage_problem: str | None


@dataclass(frozen=True)
class MonitorFigures:
    """The monitor's own counters at one moment, for /metrics and the status beside /diagnose."""

    at: float
    nodes: int
    jobs: int
    ranks: int
    reports_total: int
    full_reports_total: int
    deltas_deferred: int
    replayed_total: int
    replayed_dropped: int
    jobs_displaced: int
    claims_refused: int
    last_pass_at: float | None
    last_pass_s: float
    rejected: tuple[tuple[str, int], ...]
    # Incidents that named each node, by (node, verdict); GPU-seconds lost by (culprit node, verdict).
    node_incidents: tuple[tuple[tuple[str, str], int], ...]
    node_lost_gpu_seconds: tuple[tuple[tuple[str, str], float], ...]
    node_summaries: tuple[NodeSummary, ...]
    store: StoreFigures
    # None: actions (or captures) are off on this monitor.
    action_counts: tuple[tuple[tuple[str, str, str], int], ...] | None = None
    captures: CaptureFigures | None = None
    readiness: Readiness | None = None
    # Summarising relays' summaries taken, and each relay: (name, its last summary, nodes it summarises).
    summaries_total: int = 0
    summarising_relays: tuple[tuple[str, float, int], ...] = ()


@dataclass(frozen=True)
class TimelineSpans:
    """Some ranks' states over the window: per rank, ``(start, end, state)`` spans oldest first."""

    now: float
    window_s: float
    ranks_total: int
    spans: tuple[tuple[int, tuple[tuple[float, float, str], ...]], ...]

