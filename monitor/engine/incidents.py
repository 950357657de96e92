"""Incidents and suspect nodes: which machines keep breaking jobs.

An incident is a stretch of a job's published verdicts (already confirmed: see
``monitor.diagnosis.stability``) that are trouble: an alarm, or a rank that ended or stopped. It
runs from the first such verdict to the next healthy or finished one; its verdict is the last
one it showed (the sharpest: a stall becomes a deadlock as the stacks arrive), its culprits
every rank and node it named. The verdict changes the monitor stores already hold all of this
(each with its culprit nodes), so incidents are read from them: they live as long as the
history does (``HANGWATCH_VERDICT_RETENTION_S``, 30 days by default) and survive restarts.

A suspect node is one named as a culprit in incidents of several distinct jobs within a window:
at fleet scale most hangs trace to a few bad hosts (a flaky NIC, a GPU off the bus, a slow disk),
and one job's incident alone does not tell a bad host from a bad job.

Pure: verdict changes in, incidents and node rankings out.
"""

from __future__ import annotations

from collections import Counter

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from monitor.diagnosis.verdict_catalogue import INCIDENT_VERDICTS as INCIDENT_VERDICTS, QUIET

# Published verdicts that open (or continue) an incident are the catalogue's incident verdicts (the
# alarms, a rank that ended or stopped); the quiet ones (healthy, finished) end one, and unknown
# (the monitor cannot see) neither opens nor ends one.
ENDS_INCIDENT = QUIET


class Change(Protocol):
    """One published verdict change of a job (``monitor.storage.store.VerdictChange``)."""

    job_id: str
    at: float
    verdict: str
    culprit_ranks: tuple[int, ...]
    culprit_nodes: tuple[str, ...]


@dataclass(frozen=True)
class Incident:
    job_id: str
    verdict: str
    culprit_ranks: tuple[int, ...]
    culprit_nodes: tuple[str, ...]
    started_at: float
    # None while it lasts.
    ended_at: float | None


@dataclass(frozen=True)
class SuspectNode:
    node: str
    # The distinct jobs whose incidents named the node, newest first.
    jobs: list[str] = field(default_factory=list)
    incidents: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    last_at: float = 0.0


def incidents(changes: Iterable[Change]) -> list[Incident]:
    """The incidents in ``changes`` (any order, any jobs), oldest first."""
    by_job: dict[str, list[Change]] = {}
    for change in changes:
        by_job.setdefault(change.job_id, []).append(change)
    found: list[Incident] = []
    for job_changes in by_job.values():
        found.extend(_job_incidents(sorted(job_changes, key=lambda c: c.at)))
    return sorted(found, key=lambda i: (i.started_at, i.job_id))


def _job_incidents(changes: list[Change]) -> Iterable[Incident]:
    open_: list[Change] = []
    for change in changes:
        if change.verdict in INCIDENT_VERDICTS:
            open_.append(change)
        elif change.verdict in ENDS_INCIDENT and open_:
            yield _incident(open_, change.at)
            open_ = []
    if open_:
        yield _incident(open_, None)


def _incident(changes: list[Change], ended_at: float | None) -> Incident:
    ranks = sorted({r for c in changes for r in c.culprit_ranks})
    nodes = sorted({n for c in changes for n in c.culprit_nodes})
    return Incident(changes[0].job_id, changes[-1].verdict, tuple(ranks), tuple(nodes), changes[0].at, ended_at)


def suspect_nodes(found: Iterable[Incident], since: float) -> list[SuspectNode]:
    """Nodes named as culprits by incidents that lasted into ``[since, ...)``, most distinct jobs
    first (then most incidents, then the latest)."""
    named: dict[str, list[Incident]] = {}
    for incident in sorted(found, key=lambda i: i.started_at, reverse=True):
        if incident.ended_at is not None and incident.ended_at < since:
            continue
        for name in incident.culprit_nodes:
            named.setdefault(name, []).append(incident)
    nodes = [SuspectNode(name, jobs=list(dict.fromkeys(i.job_id for i in found_here)), incidents=len(found_here),
                         verdicts=dict(Counter(i.verdict for i in found_here)),
                         last_at=max(0.0, *(i.started_at for i in found_here)))
             for name, found_here in named.items()]
    return sorted(nodes, key=lambda n: (-len(n.jobs), -n.incidents, -n.last_at, n.node))
