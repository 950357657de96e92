"""Summaries from summarising relays, into the engine: checked, kept, and each job's record moved on.

A summary (monitor/ingest/summary_wire.py) stands for thousands of reports, so it is checked as hard as
they would be: names and ids as the report schema has them, every rank inside its job's world,
no rank twice, every member's node listed, the monitor's limits on nodes, jobs and ranks. A summary
that fails is refused whole (422) and changes nothing. One that passes is kept in the
``SummaryBook`` (monitor/ingest/summary_book.py); each job it names gets a record in the monitor's
state (without ranks of its own when no node reports to this process directly) so that the engine's
passes, history, answers and metrics treat it as any job.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from monitor.ingest.job_track import JobTrack
from monitor.ingest.limits import Limits
from monitor.ingest.state import MonitorState
from monitor.ingest.summary_book import SummaryBook
from monitor.ingest.summary_wire import JobSummary, Summary

NODE_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
RELAY_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
MAX_JOB_ID = 256


@dataclass(frozen=True)
class SummaryAnswer:
    # Ask the relay for every host's facts in its next summary (this process has none of them yet).
    hosts_full: bool
    jobs: int
    # Ranks to send whole from now on, per job (summary_wire.detail_request): those the job's answer names.
    detail: dict[str, list[int]] = field(default_factory=dict)


def check_summary(summary: Summary, limits: Limits) -> str | None:
    """Why ``summary`` is refused, or None."""
    if not RELAY_NAME.fullmatch(summary.relay):
        return "relay: 1-200 characters of A-Z a-z 0-9 _ . : -"
    if not all(math.isfinite(t) for t in (summary.sent_at, summary.started_at)):
        return "sent_at and started_at must be finite"
    if len(summary.nodes) > limits.max_nodes:
        return f"{len(summary.nodes)} nodes: more than this monitor follows (max_nodes {limits.max_nodes})"
    bad = next((n for n in summary.nodes if not NODE_NAME.fullmatch(n)), None)
    if bad is not None:
        return f"node name {bad[:64]!r}: 1-128 characters of A-Z a-z 0-9 _ . : -"
    bad = next((n for n in summary.hosts if not NODE_NAME.fullmatch(n)), None)
    if bad is not None:
        return f"host {bad[:64]!r}: not a node name"
    if len(summary.jobs) > limits.max_jobs:
        return f"{len(summary.jobs)} jobs: more than max_jobs ({limits.max_jobs})"
    ranks = 0
    for job in summary.jobs:
        why = _check_job(job, len(summary.nodes), set(summary.nodes), limits)
        if why is not None:
            return f"job {job.job_id[:64]!r}: {why}"
        ranks += len(job.ranks) + sum(len(g.members) for g in job.groups)
    if ranks > limits.max_ranks:
        return f"{ranks} ranks: more than max_ranks ({limits.max_ranks})"
    return None


def _check_job(job: JobSummary, node_count: int, nodes: set[str], limits: Limits) -> str | None:
    if not 1 <= len(job.job_id) <= MAX_JOB_ID:
        return f"a job id is 1-{MAX_JOB_ID} characters"
    if not 1 <= job.world_size <= limits.max_world_size:
        return f"world size {job.world_size}: 1 to max_world_size ({limits.max_world_size})"
    seen: set[int] = set()
    for view in job.ranks:
        if view.node not in nodes:
            return f"rank {view.rank} on {view.node[:64]!r}, a node the summary does not list"
        seen.add(view.rank)
    whole = len(seen)
    if whole != len(job.ranks):
        return "a rank sent whole twice"
    for group in job.groups:
        if not group.members:
            return "a group without members"
        for member in group.members:
            if not 0 <= member.node < node_count:
                return f"rank {member.rank}: node index {member.node} outside the summary's nodes"
            seen.add(member.rank)
        whole += len(group.members)
    if len(seen) != whole:
        return "a rank in two places"
    if seen and (min(seen) < 0 or max(seen) >= job.world_size):
        return f"ranks must lie in 0..{job.world_size - 1} (its world size)"
    return None


class SummaryIntake:
    """The book of relays' summaries and what taking one does to the monitor's state. The caller holds
    the engine's lock."""

    def __init__(self) -> None:
        self.book = SummaryBook()
        self.taken = 0
        # job id -> what its shares looked like at the last summary: (relay, its revision, ranks) each.
        self._shape: dict[str, tuple[tuple[str, int, int], ...]] = {}

    def take(self, summary: Summary, received_at: float, state: MonitorState) -> tuple[SummaryAnswer, set[str]]:
        """Keep a checked summary; the answer for the relay and the ids of the jobs it touched."""
        hosts_full = self.book.wants_hosts(summary.relay, summary.started_at) and not summary.hosts_full
        touched = self.book.take(summary, received_at)
        self.taken += 1
        for job_id in touched:
            shares = self.book.shares(job_id)
            job = state.jobs.get(job_id)
            if job is None:
                if not shares:
                    continue
                job = state.jobs[job_id] = JobTrack(job_id)
            job.last_report_at = max(job.last_report_at, received_at)
            for share in shares:
                if share.job.last_progress_at is not None:
                    job.note_rank_progress(share.job.last_progress_at + share.offset)
            if job.reported_world_size is None or not job.ranks:
                job.reported_world_size = max((s.job.world_size for s in shares), default=job.reported_world_size)
            shape = tuple(sorted((s.relay, s.job.lifecycle_revision, s.rank_count) for s in shares))
            if self._shape.get(job_id) != shape:
                self._shape[job_id] = shape
                job.lifecycle_revision += 1  # a rank started, ended or moved: judged again at once
        return SummaryAnswer(hosts_full=hosts_full, jobs=len(summary.jobs)), touched

    def forget(self, now: float, known: set[str]) -> set[str]:
        """Drop silent relays and what belongs to forgotten jobs; the jobs that lost a share."""
        for gone in set(self._shape) - known:
            del self._shape[gone]
        return self.book.forget(now)

    def rank_count(self, job_id: str) -> int:
        return self.book.rank_count(job_id)
