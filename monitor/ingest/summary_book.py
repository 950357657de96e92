"""The owner's side of summarising relays: each relay's latest summary, and a job's view merged from them.

``SummaryBook`` keeps, per relay, its latest ``Summary`` (monitor/ingest/summary_wire.py), when it came
and the facts of its hosts. ``merged_view`` adds a job's shares from every relay to the view the
owner has of it from its own reports (nodes that post to it directly, or through forwarding relays):
ranks from both, the job's progress, wait sites, phases, launchers, hosts joined. A relay that has
sent nothing for RELAY_SILENT_S makes its nodes silent nodes of the job (``unknown``, as any silent
agent does), never old evidence read as live.

Not thread-safe: the engine's lock; ``shares`` hands a pass immutable pieces to merge outside it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from monitor.diagnosis.model import HostFacts, JobView, RankView
from monitor.ingest.summary_groups import CLOCK_SKEW_S, expand, shift, shifted_time
from monitor.ingest.summary_wire import JobSummary, Summary

# A relay silent this long: its ranks are not the present (an agent's silence threshold, and a margin).
RELAY_SILENT_S = 5.0
# A relay silent this long is forgotten, its shares with it (the job retention's order).
RELAY_FORGET_S = 600.0
PROGRESS_KEPT = 64
# The relay's clock offset is taken over its last this many summaries.
SKEW_SAMPLES = 30
PHASE_MARKS_KEPT = 64


@dataclass(frozen=True)
class Share:
    """One relay's part of one job, as the last summary had it, on the owner's clock."""

    relay: str
    received_at: float
    offset: float
    nodes: tuple[str, ...]
    job: JobSummary
    rank_count: int


def rank_count(job: JobSummary) -> int:
    return len(job.ranks) + sum(len(g.members) for g in job.groups)


@dataclass
class _Relay:
    summary: Summary
    received_at: float
    offset: float
    hosts: dict[str, HostFacts] = field(default_factory=dict)
    skews: deque[float] = field(default_factory=deque)


class SummaryBook:
    def __init__(self) -> None:
        self._relays: dict[str, _Relay] = {}
        # job id -> relay -> its share.
        self._shares: dict[str, dict[str, Share]] = {}

    def take(self, summary: Summary, received_at: float) -> set[str]:
        """Keep ``summary`` as its relay's latest; the ids of the jobs it touched (and those it no longer holds)."""
        known = self._relays.get(summary.relay)
        # The relay's clock against this one: the least of its recent (arrival - sending) gaps, as NTP
        # filters, since a summary of megabytes can queue a second behind a busy loop and its wait is no skew.
        skews = known.skews if known is not None else deque(maxlen=SKEW_SAMPLES)
        skews.append(received_at - summary.sent_at)
        skew = min(skews)
        offset = skew if abs(skew) > CLOCK_SKEW_S else 0.0
        restarted = known is not None and known.summary.started_at != summary.started_at
        hosts = {} if known is None or summary.hosts_full or restarted else known.hosts
        hosts.update(summary.hosts)
        self._relays[summary.relay] = _Relay(summary, received_at, offset, hosts, skews)
        nodes = tuple(summary.nodes)
        touched: set[str] = set()
        held = {j.job_id for j in summary.jobs}
        for job_id, shares in self._shares.items():
            if summary.relay in shares and job_id not in held:
                del shares[summary.relay]  # the relay's nodes no longer run it
                touched.add(job_id)
        for job in summary.jobs:
            self._shares.setdefault(job.job_id, {})[summary.relay] = Share(summary.relay, received_at, offset, nodes, job,
                                                                           rank_count(job))
            touched.add(job.job_id)
        for job_id in [j for j, shares in self._shares.items() if not shares]:
            del self._shares[job_id]
        return touched

    def wants_hosts(self, relay: str, started_at: float) -> bool:
        """Whether the relay should send every host's facts next time (this process has none of it yet)."""
        known = self._relays.get(relay)
        return known is None or known.summary.started_at != started_at

    def job_ids(self) -> frozenset[str]:
        return frozenset(self._shares)

    def rank_count(self, job_id: str) -> int:
        return sum(s.rank_count for s in self._shares.get(job_id, {}).values())

    def shares(self, job_id: str) -> tuple[Share, ...]:
        return tuple(self._shares.get(job_id, {}).values())

    def hosts(self, shares: Iterable[Share]) -> dict[str, HostFacts]:
        """The facts of the hosts of these shares' relays (read under the lock: the dicts change)."""
        out: dict[str, HostFacts] = {}
        for share in shares:
            relay = self._relays.get(share.relay)
            if relay is not None:
                out.update(relay.hosts)
        return out

    def relays(self) -> list[tuple[str, float, int]]:
        """(relay, its last summary, nodes reporting to it), for the monitor's figures."""
        return [(name, r.received_at, len(r.summary.nodes)) for name, r in sorted(self._relays.items())]

    def forget(self, now: float) -> set[str]:
        """Drop relays silent past RELAY_FORGET_S; the jobs that lost a share."""
        gone = {name for name, r in self._relays.items() if now - r.received_at > RELAY_FORGET_S}
        touched = set()
        for name in gone:
            del self._relays[name]
            for job_id, shares in self._shares.items():
                if shares.pop(name, None) is not None:
                    touched.add(job_id)
        for job_id in [j for j, shares in self._shares.items() if not shares]:
            del self._shares[job_id]
        return touched


def merged_view(base: JobView, shares: Iterable[Share], hosts: dict[str, HostFacts]) -> JobView:
    """``base`` (the owner's own picture of the job, maybe of no rank) with the relays' shares added.
    Pure: runs outside the engine's lock, on the pass's worker thread for a giant job."""
    shares = list(shares)
    if not shares:
        return base
    now = base.now
    ranks: dict[int, RankView] = {r.rank: r for r in base.ranks}
    silent: dict[str, float] = dict(base.silent_nodes)
    reporting = set(base.nodes_reporting)
    job_nodes: set[str] = set()
    for share in shares:
        job, offset = share.job, share.offset
        relay_silent = now - share.received_at > RELAY_SILENT_S
        views: list[RankView] = [shift(v, offset) for v in job.ranks]
        for group in job.groups:
            views.extend(expand(group, share.nodes, offset))
        # Whole dicts and sets made in C: a share is thousands of ranks, seldom any also held elsewhere.
        fresh = {view.rank: view for view in views}
        for rank in fresh.keys() & ranks.keys():
            if fresh[rank].observed_at <= ranks[rank].observed_at:
                del fresh[rank]  # the newer view of a rank two sources hold wins
        ranks.update(fresh)
        job_nodes.update({view.node for view in views})
        if relay_silent:
            for node in {view.node for view in views if view.alive}:
                silent[node] = min(silent.get(node, share.received_at), share.received_at)
        if not relay_silent:
            reporting.update(share.nodes)
        for node, at in job.silent_nodes:
            silent[node] = at + offset
    jobs = [s.job for s in shares]
    offsets = [s.offset for s in shares]
    progress = sorted(list(base.job_progress_times) + [t + s.offset for s in shares for t in s.job.job_progress_times])
    marks = sorted(list(base.phase_marks) + [(t + s.offset, p) for s in shares for t, p in s.job.phase_marks])
    pauses = dict(base.pauses_by_site)
    for job in jobs:
        for site, seconds in job.pauses_by_site:
            pauses[site] = max(pauses.get(site, 0.0), seconds)
    working = [w for w in [base.working_since] + [shifted_time(s.job.working_since, s.offset) for s in shares] if w is not None]
    reasons = [j.stacks_unavailable_reason for j in jobs]
    if base.ranks:
        reasons.append(base.stacks_unavailable_reason)
    steps = [s for s in [base.job_step] + [j.job_step for j in jobs] if s is not None]
    step_times = [t for t in [base.job_step_time_s] + [j.job_step_time_s for j in jobs] if t is not None]
    merged_hosts = dict(base.hosts)
    merged_hosts.update((n, h) for n, h in hosts.items() if n in job_nodes)
    return dataclasses.replace(
        base,
        world_size=max([base.world_size if base.ranks or base.launchers else 0] + [j.world_size for j in jobs]),
        first_seen_at=min([base.first_seen_at] + [j.first_seen_at + o for j, o in zip(jobs, offsets)]),
        ranks=tuple([ranks[r] for r in sorted(ranks)]),
        job_progress_times=tuple(progress[-PROGRESS_KEPT:]),
        job_step=max(steps, default=None),
        known_wait_sites=base.known_wait_sites.union(*(j.known_wait_sites for j in jobs)),
        hosts=merged_hosts,
        stacks_unavailable_reason="; ".join(sorted(set(reasons))) if reasons and all(reasons) else None,  # type: ignore[arg-type]
        launchers=base.launchers + tuple(v for j in jobs for v in j.launchers),
        orphans=base.orphans + tuple(v for j in jobs for v in j.orphans),
        nodes_reporting=frozenset(reporting),
        phase_marks=tuple(marks[-PHASE_MARKS_KEPT:]),
        nccl=base.nccl + tuple(c for j in jobs for c in j.nccl),
        silent_nodes=tuple(sorted(silent.items())),
        replaying_nodes=base.replaying_nodes + tuple((n, t + o) for j, o in zip(jobs, offsets) for n, t in j.replaying_nodes),
        working_since=min(working, default=None),
        longest_pause_s=max([base.longest_pause_s] + [j.longest_pause_s for j in jobs]),
        pauses_by_site=tuple(sorted(pauses.items())),
        job_step_time_s=step_times[0] if step_times else None,
    )
