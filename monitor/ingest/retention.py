"""How long the monitor remembers jobs and nodes, and what it forgets to make room.

These functions update the maps ``monitor.ingest.state.MonitorState`` holds; the service calls them
through its ``prune`` and ``make_room_for_node``.
"""

from __future__ import annotations

import heapq

from monitor.ingest.job_track import JobTrack
from monitor.ingest.tracks import NodeTrack

# How long a forgotten job's dead ranks are ignored (agents stop listing them well before).
FORGOTTEN_KEPT_S = 24 * 3600.0
# How long a silent node is remembered (its jobs go after the job retention): while it is, its
# last report time stays on /metrics and the agent-silent alert holds instead of clearing itself.
SILENT_NODE_KEPT_S = 24 * 3600.0


def forget_job(jobs: dict[str, JobTrack], aliases: dict[str, str], job_id: str) -> JobTrack:
    """Drop ``job_id``, and the other ids it goes by; the job dropped."""
    job = jobs.pop(job_id)
    for name in (job_id, *job.aliases):
        aliases.pop(name, None)
    return job


def remember_forgotten(job_id: str, job: JobTrack, forgotten: dict[str, float],
                       forgotten_pids: dict[str, frozenset[tuple[str, int]]], now: float) -> None:
    """Keep a forgotten job's ids, with its processes' (node, pid), so that agents still listing its
    dead ranks do not bring it back and a new run under the id skips them."""
    pids = frozenset((t.node, t.pid) for t in (*job.ranks.values(), *job.launchers.values()))
    for name in (job_id, *job.aliases):
        forgotten[name] = now
        forgotten_pids[name] = pids


def prune(
    *,
    jobs: dict[str, JobTrack],
    nodes: dict[str, NodeTrack],
    aliases: dict[str, str],
    forgotten: dict[str, float],
    forgotten_pids: dict[str, frozenset[tuple[str, int]]],
    now: float,
    retention_s: float,
) -> list[str]:
    """Forget jobs that ended, or that no agent mentioned, more than ``retention_s`` ago (each
    remembered as forgotten). Returns the ids of the jobs forgotten."""
    dropped = []
    for job_id, job in list(jobs.items()):
        ended_at = job.ended_at
        if now - job.last_report_at > retention_s or (ended_at is not None and now - ended_at > retention_s):
            remember_forgotten(job_id, forget_job(jobs, aliases, job_id), forgotten, forgotten_pids, now)
            dropped.append(job_id)
    for name, node in list(nodes.items()):
        if now - node.last_report_at > max(retention_s, SILENT_NODE_KEPT_S):
            del nodes[name]
    for job_id, at in list(forgotten.items()):
        if now - at > FORGOTTEN_KEPT_S:
            del forgotten[job_id]
            forgotten_pids.pop(job_id, None)
    return dropped


def make_room_for_node(
    nodes: dict[str, NodeTrack], node: str, max_nodes: int, now: float, silent_s: float
) -> str | None:
    """At ``max_nodes``, forget the longest-silent node to let a new ``node`` in, if it has been
    silent for over ``silent_s`` (the job retention: its jobs are forgotten already). A silent
    node is kept for its alert (SILENT_NODE_KEPT_S), never at the cost of refusing a live one.
    Returns the node forgotten, if any."""
    if node in nodes or len(nodes) < max_nodes or not nodes:
        return None
    oldest = min(nodes, key=lambda name: nodes[name].last_report_at)
    if now - nodes[oldest].last_report_at <= silent_s:
        return None
    del nodes[oldest]
    return oldest


def ranks_total(jobs: dict[str, JobTrack]) -> int:
    """Every job's ranks together (what max_ranks bounds)."""
    return sum(len(job.ranks) for job in jobs.values())


def make_room_for_ranks(
    jobs: dict[str, JobTrack], aliases: dict[str, str], needed: int, max_ranks: int, now: float, silent_s: float,
) -> list[str]:
    """At ``max_ranks``, forget jobs silent for over ``silent_s``, the longest silent first, until
    ``needed`` new ranks fit (or no silent job is left), as ``make_room_for_jobs`` does for jobs."""
    over = ranks_total(jobs) + needed - max_ranks
    if over <= 0:
        return []
    silent = sorted((job.last_report_at, job_id) for job_id, job in jobs.items() if now - job.last_report_at > silent_s)
    chosen: list[str] = []
    for _, job_id in silent:
        if over <= 0:
            break
        over -= len(jobs[job_id].ranks)
        chosen.append(job_id)
    if over > 0:
        return []  # not room enough even so: the report is refused, and nobody is forgotten for it
    for job_id in chosen:
        forget_job(jobs, aliases, job_id)
    return chosen


def make_room_in_node(
    jobs: dict[str, JobTrack], aliases: dict[str, str], forgotten: dict[str, float],
    forgotten_pids: dict[str, frozenset[tuple[str, int]]], held: set[str], node: str, needed: int, now: float,
    silent_s: float,
) -> list[str]:
    """At its ``max_jobs_per_node``, forget up to ``needed`` of the jobs ``node`` holds alone that
    ended, or that it has not mentioned for over ``silent_s`` (those ended longest ago, then the
    longest silent, first): a node that runs many short jobs is not refused new ones for its
    finished ones, and one node's quota never costs another node a job. An ended job is remembered
    as forgotten (its dead ranks, still listed for a while, do not bring it back); a silent one is
    not (it comes back if its node speaks of it again). Returns the jobs forgotten."""
    candidates = []
    for job_id in held:
        job = jobs.get(job_id)
        if job is None or set(job.node_joined_at) - {node}:
            continue
        ended_at = job.ended_at
        if ended_at is not None:
            candidates.append((0, ended_at, job_id))
        elif now - job.last_report_at > silent_s:
            candidates.append((1, job.last_report_at, job_id))
    dropped = []
    for ended, _, job_id in heapq.nsmallest(needed, candidates):
        job = forget_job(jobs, aliases, job_id)
        held.discard(job_id)
        if ended == 0:
            remember_forgotten(job_id, job, forgotten, forgotten_pids, now)
        dropped.append(job_id)
    return dropped


def make_room_for_jobs(
    jobs: dict[str, JobTrack], aliases: dict[str, str], needed: int, max_jobs: int, now: float, silent_s: float,
) -> list[str]:
    """At ``max_jobs``, forget up to ``needed`` jobs silent for over ``silent_s``, the longest
    silent first, so ``needed`` new ones fit. Not remembered as forgotten: if its agents speak
    again (after a network partition), the job comes back. Returns the jobs forgotten."""
    over = len(jobs) + needed - max_jobs
    if over <= 0:
        return []
    silent = [(job.last_report_at, job_id) for job_id, job in jobs.items() if now - job.last_report_at > silent_s]
    if len(silent) < over:
        return []  # not room enough even so: the report is refused, and nobody is forgotten for it
    dropped = [job_id for _, job_id in heapq.nsmallest(over, silent)]
    for job_id in dropped:
        forget_job(jobs, aliases, job_id)
    return dropped
