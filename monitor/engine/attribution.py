"""Whether a job's verdict can be attributed to the nodes that report it: nothing acts otherwise.

An opt-in action (monitor/engine/actions/) turns a verdict into a command, a webhook or a signal. Every
field of a report comes from a node that may be hostile, and node-bound tokens only say which node
spoke, so a verdict may be acted on only when what it rests on is each node's word about its own
ranks (pure; the caller passes what the monitor holds):
  - every node of the job reports with a token bound to it (else any client could have spoken);
  - no other node claimed one of its ranks, or a rank past its world, in the last 2 minutes
    (monitor/ingest/rank_claims.py);
  - the job's identity (Slurm job, Kubernetes namespace, torchelastic run) is one across its
    ranks: a node that says another one is not of this job, or is lying about it, and the command
    would be given its word;
  - a culprit named only by a node that joined the job late, and only as a rank that ended (never
    seen alive), rests on that node's word alone, not the rank's own evidence.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from monitor.engine.job_names import rank_names
from monitor.ingest.job_track import JobTrack
from monitor.ingest.rank_claims import recent_conflict
from monitor.ingest.tracks import NodeTrack

# What names one run of a job: the same on every rank (a pod's own name is not: one per pod).
IDENTITY_KEYS = ("slurm_job", "k8s_namespace", "torchelastic_run_id")
# A node whose first rank of the job came this long after the job's first is a late joiner.
LATE_JOIN_S = 30.0


# How a node without a token of its own is said to report (the refusal node-bound tokens fix;
# monitor/engine/actions/would.py offers that fix when it reads this).
SHARED_TOKEN = "reports with a shared token (or none)"


def why_unattributed(job: JobTrack, culprit_ranks: Collection[int], nodes: Mapping[str, NodeTrack],
                     now: float) -> str | None:
    """Why the job's verdict cannot be acted on (None: it can)."""
    conflict = recent_conflict(job, now)
    if conflict is not None:
        what = conflict.reason or f"which node {conflict.held_by} holds"
        return (f"node {conflict.claimed_by} claimed rank {conflict.rank}, {what}: the job's evidence may not come "
                "from the nodes it names")
    unbound = sorted(n for n in job.nodes if n in nodes and not nodes[n].attributed)
    if unbound:
        return (f"node {unbound[0]}{f' and {len(unbound) - 1} more' if len(unbound) > 1 else ''} "
                f"{SHARED_TOKEN}: another client could have spoken for it")
    return identity_disagreement(job) or late_culprit(job, culprit_ranks)


def identity_disagreement(job: JobTrack) -> str | None:
    """Two ranks that name the job differently (a rank whose environment is not known yet says
    nothing); the first two such ranks' nodes and names."""
    first: tuple[str, dict[str, str]] | None = None
    for track in job.ranks.values():
        if not track.env:
            continue
        names = rank_names(track.env)
        identity = {k: names[k] for k in IDENTITY_KEYS if k in names}
        if first is None:
            first = (track.node, identity)
        elif identity != first[1]:
            return (f"the job's ranks name it differently: node {first[0]} says {_said(first[1])}, node {track.node} "
                    f"says {_said(identity)}")
    return None


def late_culprit(job: JobTrack, culprit_ranks: Collection[int]) -> str | None:
    """A culprit only ever said to have ended, by a node that joined the job late."""
    if not job.node_joined_at:
        return None
    started = min(job.node_joined_at.values())
    for rank in culprit_ranks:
        track = job.ranks.get(rank)
        if track is None or track.seen_alive:
            continue
        joined = job.node_joined_at.get(track.node, started)
        if joined - started > LATE_JOIN_S:
            return (f"rank {rank} was never seen alive: only node {track.node}, which joined the job "
                    f"{joined - started:.0f}s after it started, says it ended")
    return None


def _said(identity: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in sorted(identity.items())) or "no Slurm, Kubernetes or torchelastic id"
