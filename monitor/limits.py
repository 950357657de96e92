"""How much one monitor takes in: jobs, nodes and world sizes, checked on each decoded report.

The wire format bounds one report (string lengths, list lengths, numbers); these bound the
monitor's whole picture, so junk cannot grow it without end: 5,000 junk job ids once made real
agents' posts time out, and one 1.1 KB report claiming a world of 1,000,000 ranks produced
999,999 "missing" culprits and a 74 MB answer. A report that would pass a limit is refused
whole (nothing of it is applied), with the reason counted in ``hangwatch_reports_rejected``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limits:
    max_jobs: int = 2000
    max_nodes: int = 10000
    max_world_size: int = 65536


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # the label of hangwatch_reports_rejected
    detail: str


def check_report(report: Any, limits: Limits, jobs: Collection[str], nodes: Collection[str],
                 canonical: Callable[[str], str]) -> Refusal | None:
    """Why ``report`` must be refused (None: it may be applied). ``canonical`` maps a job id as
    the report spells it to the monitor's own (another node's spelling of the same job)."""
    for rank in report.ranks:
        if rank.world_size > limits.max_world_size:
            return Refusal(422, "world_size", f"ranks: world_size {rank.world_size} is above this monitor's "
                                              f"limit of {limits.max_world_size} (max_world_size)")
    if report.node not in nodes and len(nodes) >= limits.max_nodes:
        return Refusal(429, "too_many_nodes", f"this monitor already follows {len(nodes)} nodes (max_nodes); "
                                              "shard the cluster over more monitors")
    # Membership in the state's own key view: no copy of every job id per report.
    new_jobs = {job for job in (canonical(r.job_id) for r in report.ranks) if job not in jobs}
    if new_jobs and len(jobs) + len(new_jobs) > limits.max_jobs:
        return Refusal(429, "too_many_jobs", f"this monitor already follows {len(jobs)} jobs (max_jobs); "
                                             f"{len(new_jobs)} more would pass the limit")
    return None
