"""What a summarising relay reads of its own ``Monitor``'s live records (monitor/relay/summariser.py).

The relay keeps its nodes' picture in an engine of its own and sends the owner each giant job's
share of it. Reading the live records (the jobs' and nodes' tracks, the views made of them) is the
engine's business, under its lock, so it is done here and the relay gets immutable results: ids,
``JobView``s, host facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from monitor.diagnosis.model import HostFacts, JobView, RankView
from monitor.engine.service import VIEW_CHUNK, Monitor
from monitor.engine.views import job_view, node_facts, rank_view
from monitor.ingest.job_track import launcher_world_size
from monitor.ingest.tracks import is_fresh


@dataclass(frozen=True)
class JobShare:
    """A job as read under the lock: its view and the job's own times (monitor/ingest/summary_groups.job_summary)."""

    view: JobView
    last_report_at: float
    last_progress_at: float | None
    lifecycle_revision: int


def giant_jobs(monitor: Monitor, min_world_size: int, now: float) -> tuple[list[str], list[str]]:
    """(the ids of the jobs of at least ``min_world_size`` ranks of world size, the nodes whose
    reports say what is true now), after forgetting what ended or fell silent past the job
    retention, as the monitor's passes do (the relay runs none)."""
    monitor.forget_stale(now)  # what a pass would forget, the engine's per-node maps included
    with monitor._lock:
        state = monitor._state
        giant = [job_id for job_id, job in state.jobs.items() if job.world_size >= min_world_size]
        return giant, sorted(n for n, track in state.nodes.items() if is_fresh(track, now))


def summarised_jobs(monitor: Monitor, report: Any, min_world_size: int) -> frozenset[str]:
    """The giant jobs (the monitor's ids) of a report's ranks and launchers, by the world size the
    job has here or the one the report says (a new job's first report); of a report without any,
    the node's jobs when every one is giant (else none)."""
    with monitor._lock:
        state = monitor._state

        def giant(job_id: str) -> bool:
            job = state.jobs.get(job_id)
            return job is not None and job.world_size >= min_world_size

        ids = {state.resolve(r.job_id) for r in report.ranks}
        ids |= {state.resolve(launcher.job_id) for launcher in report.launchers if launcher.job_id}
        if not ids:
            held = set(state.jobs_of_node(report.node))
            return frozenset(held) if held and all(giant(j) for j in held) else frozenset()
        said = {state.resolve(r.job_id) for r in report.ranks if r.world_size >= min_world_size}
        said |= {state.resolve(launcher.job_id) for launcher in report.launchers
                 if launcher.job_id and (launcher_world_size(launcher) or 0) >= min_world_size}
        return frozenset(said | {j for j in ids if giant(j)})


def job_share(monitor: Monitor, job_id: str, now: float) -> JobShare | None:
    """The job's view, its ranks taken a chunk at a time under the lock (ingest waits at most a
    chunk); the views of ranks that did not report since are cached (views.rank_view). None: the
    job is gone, or a new run took its id meanwhile."""
    lock, state = monitor._lock, monitor._state
    with lock:
        job = state.jobs.get(job_id)
        if job is None:
            return None
        rank_ids = sorted(job.ranks)
    views: list[RankView] = []
    for start in range(0, len(rank_ids), VIEW_CHUNK):
        with lock:
            tracks = job.ranks
            views.extend(rank_view(tracks[r]) for r in rank_ids[start:start + VIEW_CHUNK] if r in tracks)
    with lock:
        if state.jobs.get(job_id) is not job:
            return None
        if len(views) != len(job.ranks):  # a rank joined meanwhile
            views = [rank_view(job.ranks[r]) for r in sorted(job.ranks)]
        view = job_view(job, state.nodes, now, monitor.started_at, tuple(views), state.cpu_level_window_s)
        return JobShare(view, job.last_report_at, job.last_progress_at, job.lifecycle_revision)


# A node's host report (the object, compared by identity: ingest keeps it while a delta leaves it
# out) and its facts.
HostSeen = tuple[object, HostFacts]


def host_changes(monitor: Monitor, nodes: Iterable[str], sent: dict[str, HostSeen],
                 everything: bool) -> tuple[dict[str, HostFacts], dict[str, HostSeen]]:
    """(the facts of ``nodes``' hosts that changed since ``sent``, or of all of them; each node's
    host as it is now, to be ``sent`` once the owner has these)."""
    changed: dict[str, HostFacts] = {}
    now_seen: dict[str, HostSeen] = {}
    with monitor._lock:
        tracks = monitor._state.nodes
        for node in nodes:
            track = tracks.get(node)
            if track is None:
                continue
            before = sent.get(node)
            if before is not None and before[0] is track.host and not everything:
                now_seen[node] = before
                continue
            facts = node_facts(track)
            now_seen[node] = (track.host, facts)
            if everything or before is None or before[1] != facts:  # a new full report, the same facts: not sent
                changed[node] = facts
    return changed, now_seen
