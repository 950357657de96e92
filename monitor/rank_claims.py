"""A node speaks only for its own ranks.

Node-bound tokens stop node A from posting as node B, but A's report names its ranks by (job,
rank): without this check A could claim a rank that lives on B, and the monitor would move the
rank to A and judge the job from A's made-up picture (a deadlock hidden, or one invented for an
action to act on). A live rank the monitor last saw alive on another node that still reports is
that node's: another node's claim to it is refused, kept as a conflict on the job (shown in its
JSON and on /diagnose) and counted, and is never read by a verdict.

Legitimate moves still work: once the holding node says the rank ended (an elastic restart ends
every worker before it starts new ones) or goes silent (its node died and the rank was launched
elsewhere), the next claim is taken and the conflict is gone.
"""

from __future__ import annotations

from collections.abc import Mapping

from monitor.job_track import JobTrack
from monitor.tracks import ClaimConflict, NodeTrack
from monitor.views import is_fresh

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


def recent_conflict(job: JobTrack, now: float) -> ClaimConflict | None:
    """A claim refused within CONFLICT_RECENT_S, if any (monitor/actions/: nothing acts then)."""
    return next((c for c in job.claim_conflicts.values() if now - c.last_at <= CONFLICT_RECENT_S), None)


def note_conflict(job: JobTrack, rank: int, claimed_by: str, held_by: str, at: float) -> None:
    """Keep the refused claim on the job; the oldest conflict gives way past ``CONFLICTS_KEPT``."""
    conflicts = job.claim_conflicts
    known = conflicts.get(rank)
    if known is not None and (known.claimed_by, known.held_by) == (claimed_by, held_by):
        known.last_at = max(known.last_at, at)
        known.refused += 1
        return
    if rank not in conflicts and len(conflicts) >= CONFLICTS_KEPT:
        del conflicts[min(conflicts, key=lambda r: conflicts[r].last_at)]
    conflicts[rank] = ClaimConflict(rank, claimed_by, held_by, at, at)

