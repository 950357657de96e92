"""How much one monitor takes in: jobs, nodes and world sizes, checked on each decoded report.

The wire format bounds one report (string lengths, list lengths, numbers); these bound the
monitor's whole picture, so junk cannot grow it without end: 5,000 junk job ids once made real
agents' posts time out, and one 1.1 KB report claiming a world of 1,000,000 ranks produced
999,999 "missing" culprits and a 74 MB answer. A report that would pass a limit is refused
whole (nothing of it is applied), with the reason counted in ``hangwatch_reports_rejected``.

One sender must not lock the others out: a node may hold at most ``max_jobs_per_node`` jobs, counted
across all its reports (2,000 junk jobs spread over 32 reports of 63 once passed a per-report
count), and at ``max_jobs`` the jobs no agent has mentioned for ``job_room_silent_s`` make room for new
ones (monitor/ingest/retention.py) instead of holding their places for the whole job retention (2,000
junk jobs sent once used to refuse every new job for 10 minutes). ``max_ranks`` bounds the ranks of
all jobs together, so memory is bounded however the ranks are spread (a report may list 4,096
ranks, and 10,000 node names may send one each); at it, jobs silent as long make room the same way.

The excess of a node's jobs is refused, not the node: a report that brings new jobs past either
job limit has those jobs' entries refused (``excess_jobs``) and the rest taken, so a node whose new
job does not fit keeps reporting the live jobs it has (they once went silent under whole-report
refusals, and were forgotten to make room for the very junk that filled the monitor).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container
from dataclasses import dataclass
from typing import Any

from hangwatch_common.settings import setting


@dataclass(frozen=True)
class Limits:
    """The monitor's settings of the same names (monitor/web/settings.py), declared here beside their checks."""

    max_jobs: int = setting(2000, help="jobs one monitor follows at most: a report bringing more is refused (429)",
                            at_least=1)
    max_nodes: int = setting(10000, help="nodes one monitor follows at most: a new one past it is refused (429)",
                             at_least=1)
    max_world_size: int = setting(65536, help="largest world size a report's ranks may claim (422 past it)",
                                  at_least=1)
    # One sender (a node-bound token is one node) cannot take them all.
    max_jobs_per_node: int = setting(64, help="one node's share of max-jobs, counted across its reports: only the "
                                     "excess is refused", at_least=1)
    # (monitor/ingest/retention.make_room_for_jobs): junk sent once goes quiet at once, a live job's
    # agents mention it every second.
    job_room_silent_s: float = setting(60.0, help="at max-jobs or max-ranks, a job no agent has mentioned for this "
                                       "many seconds gives its place to a new one", positive=True)
    # Past what one process serves (about 5,000 a core), far short of what would exhaust its memory
    # (a rank's track and view, ~55 KiB at most).
    max_ranks: int = setting(100_000, help="ranks of every job together at most (429 past it)", at_least=1)


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # the label of hangwatch_reports_rejected
    detail: str
    # too_many_jobs / too_many_ranks: how many jobs / ranks the report would add (places to make for it).
    new_jobs: int = 0
    new_ranks: int = 0
    # The report's jobs (the monitor's ids) that do not fit: only their entries are refused, where
    # the report brings others too.
    excess_jobs: frozenset[str] = frozenset()


def check_report(report: Any, limits: Limits, jobs: Collection[str], nodes: Collection[str],
                 canonical: Callable[[str], str], known_ranks: Callable[[str], Container[int]] = lambda job: (),
                 ranks_total: Callable[[], int] = lambda: 0,
                 node_jobs: Callable[[str], Collection[str]] = lambda node: ()) -> Refusal | None:
    """Why ``report`` must be refused, whole or for its ``excess_jobs`` (None: it may be applied).
    ``canonical`` maps a job id as the report spells it to the monitor's own (another node's
    spelling of the same job); ``known_ranks(job)`` the ranks the monitor holds of a job,
    ``ranks_total()`` of all jobs (asked only when the report brings ranks the monitor does not
    hold); ``node_jobs(node)`` the jobs the node holds ranks of, from its earlier reports."""
    for rank in report.ranks:
        if rank.world_size > limits.max_world_size:
            return Refusal(422, "world_size", f"ranks: world_size {rank.world_size} is above this monitor's "
                                              f"limit of {limits.max_world_size} (max_world_size)")
    if report.node not in nodes and len(nodes) >= limits.max_nodes:
        return Refusal(429, "too_many_nodes", f"this monitor already follows {len(nodes)} nodes (max_nodes); "
                                              "shard the cluster over more monitors")
    report_jobs = {canonical(r.job_id) for r in report.ranks}
    held = node_jobs(report.node)
    joining = sorted(job for job in report_jobs if job not in held)  # sorted: the same excess every time
    room = limits.max_jobs_per_node - len(held)
    if len(joining) > room:
        excess = frozenset(joining[max(room, 0):])
        return Refusal(429, "node_jobs", f"node {report.node} holds {len(held)} jobs and reports {len(joining)} more; "
                                         f"this monitor takes at most {limits.max_jobs_per_node} from one node "
                                         f"(max_jobs_per_node): {_named(excess)} refused", excess_jobs=excess)
    # Membership in the state's own key view: no copy of every job id per report.
    new_jobs = sorted(job for job in report_jobs if job not in jobs)
    if new_jobs and len(jobs) + len(new_jobs) > limits.max_jobs:
        excess = frozenset(new_jobs[max(limits.max_jobs - len(jobs), 0):])
        return Refusal(429, "too_many_jobs", f"this monitor already follows {len(jobs)} jobs (max_jobs); "
                                             f"{len(new_jobs)} more would pass the limit: {_named(excess)} refused",
                       len(new_jobs), excess_jobs=excess)
    new_ranks: set[tuple[str, int]] = set()
    for r in report.ranks:
        job = canonical(r.job_id)
        if r.rank not in known_ranks(job):
            new_ranks.add((job, r.rank))
    if new_ranks and (total := ranks_total()) + len(new_ranks) > limits.max_ranks:
        return Refusal(429, "too_many_ranks", f"this monitor already follows {total} ranks (max_ranks); "
                                              f"{len(new_ranks)} more would pass the limit", new_ranks=len(new_ranks))
    return None


def _named(job_ids: Collection[str]) -> str:
    shown = sorted(job_ids)[:3]
    more = len(job_ids) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")
