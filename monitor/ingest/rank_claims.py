"""A node speaks only for its own ranks.

Node-bound tokens stop node A from posting as node B, but A's report names its ranks by (job,
rank): without this check A could claim a rank that lives on B, and the monitor would move the
rank to A and judge the job from A's made-up picture (a deadlock hidden, or one invented for an
action to act on). A live rank the monitor last saw alive on another node that still reports is
that node's: another node's claim to it is refused, kept as a conflict on the job (shown in its
JSON and on /diagnose) and counted, and is never read by a verdict.

Nor can a node add ranks past the job: a rank numbered at or past the world size another node's
live ranks of the job report (or its own entry's) is refused the same way. "rank 2 failed", posted
into a 2-rank job by a node that has no part in it, once made the job ``rank_exited [2]`` (and a
command rule ran against the real job).

Legitimate moves still work: once the holding node says the rank ended (an elastic restart ends
every worker before it starts new ones) or goes silent (its node died and the rank was launched
elsewhere), the next claim is taken and the conflict is gone.
"""

from __future__ import annotations

from collections.abc import Mapping

from monitor.ingest.job_track import JobTrack
from monitor.ingest.tracks import ClaimConflict, NodeTrack
from monitor.ingest.tracks import heard_lately, is_fresh

# Conflicts kept per job: an attacker claiming every rank of a giant job must not grow it unbounded.
CONFLICTS_KEPT = 64
# A conflict this recent makes the job's verdicts unattributable: no opt-in action acts on them.
CONFLICT_RECENT_S = 120.0


def rival_holder(job: JobTrack, node: str, rank: int, nodes: Mapping[str, NodeTrack], at: float) -> str | None:
    """The other node that holds ``rank`` of ``job`` alive and still reports, if any: ``node``'s
    claim to the rank is then refused."""
    held = job.ranks.get(rank)
    if held is None or held.node == node or not held.alive:
        return None
    holder = nodes.get(held.node)
    if holder is None or not is_fresh(holder, at):
        return None
    return held.node


def world_bound(job: JobTrack, node: str, nodes: Mapping[str, NodeTrack], at: float) -> tuple[int, str] | None:
    """The smallest world size another node's live ranks of ``job`` report, with that node (one
    whose agent still reports); None when no other node says. An elastic restart that changes the
    world size ends every worker first, so the old size goes with the old workers' node entries.

    Asked for every rank of every report: the node that vouched last time is asked first. A node
    counts once heard, even while its full report is due (``heard_lately``): after a restart no node
    is fresh until its full report, and scanning all 1,250 nodes of a 10,000-rank job for each rank
    was most of the restore's time (and the bound was lost while the picture rebuilt)."""
    witnesses = job.world_witness
    for world in sorted(job.nodes_by_world):
        holders = job.nodes_by_world[world]
        known = witnesses.get(world)
        if known is not None and _vouches(known, node, holders, nodes, at):
            return world, known
        for other in holders:
            if _vouches(other, node, holders, nodes, at):
                witnesses[world] = other
                return world, other
    return None


def _vouches(other: str, node: str, holders: set[str], nodes: Mapping[str, NodeTrack], at: float) -> bool:
    holder = nodes.get(other)
    return other != node and other in holders and holder is not None and heard_lately(holder, at)


def past_the_world(job: JobTrack, node: str, rank: int, world_size: int, nodes: Mapping[str, NodeTrack],
                   at: float) -> tuple[str, str] | None:
    """(the node whose word bounds it, why) when ``rank`` is past the job's world: its own entry's
    size, or the smallest another node's live ranks report."""
    if rank >= world_size:
        return node, f"past the world size {world_size} its own entry gives"
    bound = world_bound(job, node, nodes, at)
    if bound is not None and rank >= bound[0]:
        return bound[1], f"past the world size {bound[0]} that node {bound[1]}'s ranks report"
    return None


def note_world(job: JobTrack, node: str, world_size: int | None) -> None:
    """The world size ``node``'s live ranks of ``job`` report now (None: it has no live rank of it)."""
    known = job.world_by_node.get(node)
    if known == world_size:
        return
    if known is not None:
        holders = job.nodes_by_world[known]
        holders.discard(node)
        if not holders:
            del job.nodes_by_world[known]
            job.world_witness.pop(known, None)
        del job.world_by_node[node]
    if world_size is not None:
        job.world_by_node[node] = world_size
        job.nodes_by_world.setdefault(world_size, set()).add(node)


def recent_conflict(job: JobTrack, now: float) -> ClaimConflict | None:
    """A claim refused within CONFLICT_RECENT_S, if any (monitor/engine/actions/: nothing acts then)."""
    return next((c for c in job.claim_conflicts.values() if now - c.last_at <= CONFLICT_RECENT_S), None)


def note_conflict(job: JobTrack, rank: int, claimed_by: str, held_by: str, at: float, reason: str = "") -> None:
    """Keep the refused claim on the job; the oldest conflict gives way past ``CONFLICTS_KEPT``. A new
    conflict moves the job's lifecycle: its answer shows it at the next read, not at the next refresh."""
    conflicts = job.claim_conflicts
    known = conflicts.get(rank)
    if known is not None and (known.claimed_by, known.held_by, known.reason) == (claimed_by, held_by, reason):
        known.last_at = max(known.last_at, at)
        known.refused += 1
        return
    if rank not in conflicts and len(conflicts) >= CONFLICTS_KEPT:
        del conflicts[min(conflicts, key=lambda r: conflicts[r].last_at)]
    conflicts[rank] = ClaimConflict(rank, claimed_by, held_by, at, at, reason=reason)
    job.lifecycle_revision += 1

