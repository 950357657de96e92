"""What hangs cost: rank-seconds (and GPU-seconds) a job spent under each published alarm.

Each diagnosis the monitor publishes closes an interval: the time since the previous one, at
the verdict that was in force over it, times the job's live ranks then (those with GPUs known,
for GPU-seconds: one GPU a rank, the usual launch). A hang idles every GPU of the job, so that is
the job's loss; for "which hosts cost us most" it is also put on the culprit ranks' nodes (split
evenly; an alarm that names no culprit goes to ``UNATTRIBUTED``).

Only incident verdicts count (``monitor.engine.incidents.INCIDENT_VERDICTS``): a rank that ended or
stopped holds its peers as a deadlock does. An interval longer than ``MAX_INTERVAL_S`` (the
monitor was down, or restarted) counts that long at most: an outage is not evidence.

Pure: the caller keeps one ``JobCost`` per job and the node totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from monitor.engine.incidents import INCIDENT_VERDICTS

MAX_INTERVAL_S = 30.0
UNATTRIBUTED = "unattributed"


@dataclass
class JobCost:
    # Seconds lost by verdict: rank-seconds, GPU-seconds.
    rank_seconds: dict[str, float] = field(default_factory=dict)
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    # The verdict in force since ``since``, with the live ranks, GPU ranks and culprit nodes it had.
    verdict: str | None = None
    since: float | None = None
    ranks: int = 0
    gpus: int = 0
    culprit_nodes: tuple[str, ...] = ()


def account(cost: JobCost, now: float, verdict: str, ranks: int, gpus: int, culprit_nodes: tuple[str, ...],
            node_gpu_seconds: dict[tuple[str, str], float]) -> None:
    """Close the interval since the last call at the verdict then in force; start the next one.
    A call before the last (a report replayed after an outage, judged at its own time) is ignored."""
    if cost.since is not None and now < cost.since:
        return
    if cost.verdict in INCIDENT_VERDICTS and cost.since is not None and now > cost.since:
        seconds = min(now - cost.since, MAX_INTERVAL_S)
        lost = cost.verdict
        cost.rank_seconds[lost] = cost.rank_seconds.get(lost, 0.0) + seconds * cost.ranks
        if cost.gpus:
            cost.gpu_seconds[lost] = cost.gpu_seconds.get(lost, 0.0) + seconds * cost.gpus
            nodes = cost.culprit_nodes or (UNATTRIBUTED,)
            for node in nodes:
                key = (node, lost)
                node_gpu_seconds[key] = node_gpu_seconds.get(key, 0.0) + seconds * cost.gpus / len(nodes)
    cost.verdict, cost.since, cost.ranks, cost.gpus, cost.culprit_nodes = verdict, now, ranks, gpus, culprit_nodes


def lost_text(cost: JobCost) -> str | None:
    """One line for a person: what the job lost, by verdict; None when nothing."""
    if not cost.rank_seconds:
        return None
    total = sum(cost.rank_seconds.values())
    parts = ", ".join(f"{verdict.replace('_', ' ')} {_span(s)}"
                      for verdict, s in sorted(cost.rank_seconds.items(), key=lambda vs: -vs[1]))
    gpus = sum(cost.gpu_seconds.values())
    gpu_part = f"; {_span(gpus)} of GPU time" if gpus else ""
    return f"time lost to hangs: {_span(total)} of rank time ({parts}){gpu_part}"


def _span(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
