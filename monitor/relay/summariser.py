"""A summarising relay's own picture of its nodes (``hangwatch-relay --summarise``, docs/scaling.md).

At 100,000 ranks in one job the owner cannot apply every report. A summarising relay applies its
nodes' reports to a ``Monitor`` of its own (the engine, without passes: it never diagnoses) and
sends the owner, once a second, a ``Summary`` of each giant job (monitor/ingest/summary_wire.py):
its ranks grouped by what they do. A job is giant from ``summarise_ranks`` ranks of world size;
the ranks of smaller jobs still go to the owner as reports, each agent waiting for the owner's
answer as through a forwarding relay. A report of giant ranks only is answered here.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor.engine.engine_settings import EngineSettings
from monitor.engine.relay_picture import HostSeen, giant_jobs, host_changes, job_share, summarised_jobs
from monitor.engine.service import Monitor
from monitor.ingest.summary_groups import RowMemo, job_summary
from monitor.ingest.summary_wire import JobSummary, Summary, detail_request, encode_summary
from monitor.storage.store import Store, StoreSettings
from monitor.web.routes.ingest import Answer

# From this world size a job is summarised (the --summarise-ranks default).
SUMMARISE_RANKS = 512
# The relay takes any world size the report schema allows: the owner judges a job's size (its
# max_world_size) when the summary comes, and a relay of default limits would refuse a 100,000-rank job.
MAX_WORLD_SIZE = 1_000_000


def default_name(port: int) -> str:
    return f"{socket.gethostname()}:{port}"


@dataclass(frozen=True)
class Taken:
    """A report the relay took: ``answer`` is the agent's when nothing goes on (giant jobs' ranks
    only, applied here); else ``forward`` goes to the owner, and once the owner takes it, ``report``
    is applied here too (``Summariser.apply``)."""

    answer: dict[str, Any] | None
    forward: Any | None
    report: Any
    refused_jobs: dict[str, Any] = field(default_factory=dict)


class Summariser:
    """The relay's ``Monitor`` and what its summaries last told the owner. ``take`` runs on the event
    loop, ``summary`` on a worker thread: the Monitor's lock keeps its state whole between them; the
    rest is ``summary``'s and ``answered``'s, one summary in flight at a time."""

    def __init__(self, name: str, summarise_ranks: int = SUMMARISE_RANKS, *,
                 clock: Callable[[], float] = time.time,
                 on_refused: Callable[[str], None] = lambda reason: None) -> None:
        self.name, self.summarise_ranks, self.clock, self.on_refused = name, summarise_ranks, clock, on_refused
        self.started_at = clock()
        # No history at a relay: the store is in this process's memory, a snapshot per node at most.
        self.store = Store(f"file:hangwatch-relay-{id(self)}?mode=memory&cache=shared",
                           StoreSettings(snapshots_per_node=1, snapshot_budget_bytes=64 * 1024 * 1024,
                                         min_free_bytes=0), clock=clock)
        self.monitor = Monitor(self.store, EngineSettings(tick_interval_s=0.0, max_world_size=MAX_WORLD_SIZE),
                               clock=clock)
        # Each node's host report and facts as the owner last accepted them; all of them next time.
        self._sent_hosts: dict[str, HostSeen] = {}
        self._send_all_hosts = True
        self._owner_holds_jobs = False
        # What the summary in flight holds, kept once the owner accepts it.
        self._pending: tuple[dict[str, HostSeen], set[str]] | None = None
        # Per giant job, what the last summary worked out of each rank's view (summary_groups.RowMemo).
        self._rows: dict[str, RowMemo] = {}
        # Per giant job, the ranks the owner's last answer asked to have whole (summary_wire.detail_request).
        self._detail: dict[str, frozenset[int]] = {}

    def close(self) -> None:
        self.store.close()

    def take(self, report: Any, attributed: bool) -> Taken:
        """Take a decoded report in; refused (an ``Answer``) where the monitor would refuse it."""
        monitor = self.monitor
        refusal = monitor.refusal(report)
        if refusal is not None:
            refusal = monitor.make_room(report, refusal)
        refused_jobs: dict[str, Any] = {}
        if refusal is not None:
            monitor.reject(refusal.reason)
            self.on_refused(refusal.reason)
            rest = monitor.without_jobs(report, refusal.excess_jobs) if refusal.excess_jobs else None
            if rest is None or not rest.ranks:
                raise Answer(refusal.status, {"accepted": False, "detail": refusal.detail})
            report = rest  # only the excess is refused, as at the monitor
            refused_jobs = {"refused_jobs": {"jobs": sorted(refusal.excess_jobs)[:64], "detail": refusal.detail}}
        summarised = summarised_jobs(monitor, report, self.summarise_ranks)
        rest = monitor.without_jobs(report, summarised) if summarised else report
        if summarised and not rest.ranks and not rest.launchers:
            return Taken(self._applied(report, attributed, refused_jobs), None, report)
        return Taken(None, rest, report, refused_jobs)

    def apply(self, taken: Taken, attributed: bool) -> dict[str, Any]:
        """Apply a forwarded report here, once the owner took it (never before: one the owner did not
        take comes back from the agent's outage journal, and must be news here then, not stale);
        the answer from the relay's picture, for ``merge_answer``."""
        if self.monitor.refusal(taken.report) is not None:
            # A newer report of the node got here while this one was at the owner: old news here.
            return {"accepted": True, "ranks": len(taken.report.ranks), "send_full": False}
        return self._applied(taken.report, attributed, taken.refused_jobs)

    def _applied(self, report: Any, attributed: bool, refused_jobs: dict[str, Any]) -> dict[str, Any]:
        """Apply ``report``; the monitor's answer (monitor/web/routes/ingest.py) from the relay's picture."""
        answer = self.monitor.ingest(report, attributed=attributed)
        return {"accepted": True, "ranks": len(report.ranks), "delta": True, "send_full": answer.send_full,
                "replay": True, **({"full_in_s": answer.full_in_s} if answer.send_full else {}), **refused_jobs}

    def summary(self, now: float | None = None) -> Summary | None:
        """The giant jobs of the relay's nodes as the owner's summary; None when there is nothing to
        say (no giant job now, and the owner holds none of the relay's). Forgets what ended or fell
        silent (the job retention), as the monitor's passes do."""
        now = self.clock() if now is None else now
        giant, fresh = giant_jobs(self.monitor, self.summarise_ranks, now)
        for gone in self._rows.keys() - set(giant):
            del self._rows[gone]
        if not giant and not self._owner_holds_jobs:
            return None
        node_index = {node: i for i, node in enumerate(fresh)}
        jobs: list[JobSummary] = []
        for job_id in giant:
            share = job_share(self.monitor, job_id, now)
            if share is None:
                continue  # forgotten meanwhile
            summarised = job_summary(share.view, node_index, share.last_report_at, share.last_progress_at,
                                     share.lifecycle_revision, self._rows.setdefault(job_id, {}),
                                     self._detail.get(job_id, frozenset()))
            for view in summarised.ranks:  # a silent node's ranks: its name must be listed too
                node_index.setdefault(view.node, len(node_index))
            jobs.append(summarised)
        hosts, seen = host_changes(self.monitor, node_index, self._sent_hosts, self._send_all_hosts)
        self._pending = (seen, {j.job_id for j in jobs})
        return Summary(relay=self.name, sent_at=self.clock(), started_at=self.started_at, nodes=list(node_index),
                       jobs=jobs, hosts=hosts, hosts_full=self._send_all_hosts)

    def summary_body(self) -> bytes | None:
        """``summary()`` encoded: all of it CPU work, for a worker thread."""
        summary = self.summary()
        return None if summary is None else encode_summary(summary)

    def answered(self, hosts_full: bool, detail: object = None) -> None:
        """The owner accepted the last summary; ``hosts_full``: it asks for every host's facts next;
        ``detail``: its answer's ranks to send whole (summary_wire.detail_request), kept until the next answer."""
        jobs: set[str] = set()
        if self._pending is not None:
            self._sent_hosts, jobs = self._pending
            self._owner_holds_jobs = bool(jobs)
        self._pending = None
        self._send_all_hosts = hosts_full
        self._detail = detail_request(detail, jobs)


def merge_answer(owner: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    """The owner's answer to the part it got, with what the relay's own picture asks: a full report
    when the relay needs one, the entries the relay refused, every rank the relay took."""
    out = dict(owner)
    if not owner.get("accepted"):
        return out
    out["ranks"] = local["ranks"]
    if local["send_full"] and not owner.get("send_full"):
        out.update(send_full=True, full_in_s=local["full_in_s"])
    if "refused_jobs" in local and "refused_jobs" not in owner:
        out["refused_jobs"] = local["refused_jobs"]
    return out
