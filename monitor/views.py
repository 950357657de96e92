"""Turn the monitor's tracked state into the diagnosis's immutable ``JobView``."""

from __future__ import annotations

from collections.abc import Mapping

from monitor.diagnosis import HostFacts, JobView, RankView
from monitor.state import JobTrack, NodeTrack, RankTrack


def rank_view(track: RankTrack) -> RankView:
    rr = track.latest
    return RankView(
        rank=track.rank,
        node=track.node,
        pid=track.pid,
        alive=track.alive,
        observed_at=track.observed_at,
        first_seen_at=track.first_seen_at,
        exit=track.exit,
        proc_state=track.proc_state,
        state_since=track.state_since,
        cpu_percent=rr.cpu_percent,
        idle_since=track.idle_since,
        write_bytes_per_s=rr.write_bytes_per_s,
        step=rr.progress.step if rr.progress else None,
        progress_times=tuple(track.progress_times),
        stack=track.stack,
        stack_error=rr.stack_error,
        log_errors=tuple(track.log_errors),
    )


def job_view(job: JobTrack, nodes: Mapping[str, NodeTrack], now: float) -> JobView:
    ranks = tuple(rank_view(job.ranks[r]) for r in sorted(job.ranks))
    job_nodes = [nodes[n] for n in sorted({t.node for t in job.ranks.values()}) if n in nodes]
    return JobView(
        job_id=job.job_id,
        world_size=job.world_size,
        now=now,
        first_seen_at=job.first_seen_at,
        ranks=ranks,
        job_progress_times=tuple(job.progress_times),
        job_step=job.job_step,
        known_wait_sites=frozenset(job.known_wait_sites),
        hosts={n.node: HostFacts(frozenset(n.host.cpu_flags), n.host.cpu_model) for n in job_nodes},
        stacks_unavailable_reason=stacks_unavailable_reason(job_nodes),
    )


def stacks_unavailable_reason(nodes: list[NodeTrack]) -> str | None:
    """Why no stacks can be had, when every node of the job says so (an agent that says nothing proves nothing)."""
    reasons = [n.agent.py_spy for n in nodes]
    if not reasons or any(r is None or r == "ok" for r in reasons):
        return None
    distinct = sorted(set(r for r in reasons if r))
    return "; ".join(distinct) or None
