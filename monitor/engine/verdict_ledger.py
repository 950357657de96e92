"""What each published verdict leaves behind: a row of the job's history when it changes, the
incidents it counts against nodes, and what the hang cost (monitor/engine/hang_cost.py).

The engine calls it under its lock as each diagnosis is published; /metrics reads its totals
through ``MonitorFigures``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from monitor.diagnosis import Diagnosis, JobView
from monitor.engine.hang_cost import JobCost, account
from monitor.engine.incidents import ENDS_INCIDENT, INCIDENT_VERDICTS
from monitor.storage.store import Store, VerdictChange

VerdictKey = tuple[str, tuple[int, ...]]
# A forgotten job's last verdicts are kept this long: its agents' reports kept through an outage (at
# most an hour old: service.MAX_REPLAY_AGE_S), or the job reporting again after a restart that found it
# silent, must not record what its history already says a second time.
FORGOTTEN_KEPT_S = 3600.0
# At most this many forgotten jobs' verdicts, the oldest dropped first (~200 bytes each).
FORGOTTEN_KEPT_MAX = 100_000


class VerdictLedger:
    def __init__(self, store: Store) -> None:
        self._store = store
        # The last verdict recorded in each job's history, per timeline: the present (live judgements)
        # and the past rebuilt from reports replayed after an outage, which arrive while the present is
        # judged too. Each dedupes against its own: an interleaved live "unknown" must not make the
        # replays record their verdicts twice, nor a live reading made from them stop the replays from
        # recording them at their own times.
        self._last: dict[str, VerdictKey] = {}
        self._last_replayed: dict[str, VerdictKey] = {}
        # Jobs the monitor forgot: (when, last, last replayed), oldest first (``keep_only``).
        self._forgotten: OrderedDict[str, tuple[float, VerdictKey | None, VerdictKey | None]] = OrderedDict()
        # Incidents that named each node, by (node, verdict), since this process started; the nodes
        # each job's open incident named so far.
        self.node_incidents: dict[tuple[str, str], int] = {}
        self._incident_nodes: dict[str, set[str]] = {}
        # What hangs cost: per job, and GPU-seconds by (culprit node, verdict).
        self._costs: dict[str, JobCost] = {}
        self.node_lost_gpu_seconds: dict[tuple[str, str], float] = {}

    def restore(self, job_id: str, key: VerdictKey) -> None:
        """The job's last stored verdict, read back at a restart: not recorded a second time."""
        self._last[job_id] = self._last_replayed[job_id] = key

    def account(self, job_id: str, view: JobView, published: Diagnosis, culprit_nodes: tuple[str, ...],
                now: float) -> JobCost:
        """The time since the job's last diagnosis, at the verdict then in force; the job's cost so far."""
        cost = self._costs.setdefault(job_id, JobCost())
        ranks = gpus = 0
        if published.verdict in INCIDENT_VERDICTS:  # counted only while it costs: a giant job has 10,000 ranks
            for r in view.ranks:
                if r.alive:
                    ranks += 1
                    gpus += r.gpu_utilization_percent is not None
        account(cost, now, published.verdict, ranks, gpus, culprit_nodes, self.node_lost_gpu_seconds)
        return cost

    def record(self, job_id: str, published: Diagnosis, now: float, culprit_nodes: tuple[str, ...],
               live: bool) -> None:
        """A history row when the verdict or its culprits changed on this timeline (live or replayed)."""
        key = (published.verdict, tuple(published.culprit_ranks))
        forgotten = self._forgotten.pop(job_id, None)
        if forgotten is not None:  # back within FORGOTTEN_KEPT_S: its history goes on from where it was
            for held, value in ((self._last, forgotten[1]), (self._last_replayed, forgotten[2])):
                if value is not None:
                    held.setdefault(job_id, value)
        last = self._last if live else self._last_replayed
        if last.get(job_id) == key:
            return
        last[job_id] = key
        if live and published.verdict != "unknown":
            # What the job is now is where the next outage's replays start from (the monitor
            # not knowing says nothing of what happened).
            self._last_replayed[job_id] = key
        self._store.add_verdict(VerdictChange(job_id, now, published.verdict, key[1], published.summary,
                                              culprit_nodes))
        self._count_incident(job_id, published.verdict, culprit_nodes)

    def _count_incident(self, job_id: str, verdict: str, nodes: tuple[str, ...]) -> None:
        """hangwatch_node_incidents_total: once per node an incident of the job names."""
        if verdict in ENDS_INCIDENT:
            self._incident_nodes.pop(job_id, None)
        elif verdict in INCIDENT_VERDICTS:
            named = self._incident_nodes.setdefault(job_id, set())
            for node in nodes:
                if node not in named:
                    named.add(node)
                    self.node_incidents[node, verdict] = self.node_incidents.get((node, verdict), 0) + 1

    def keep_only(self, known: Collection[str], now: float) -> None:
        """What it keeps per job goes with the job (the per-node totals stay: they are since the start);
        a forgotten job's last verdicts are kept a while longer (FORGOTTEN_KEPT_S)."""
        for job_id in (self._last.keys() | self._last_replayed.keys()) - known:
            self._forgotten[job_id] = (now, self._last.pop(job_id, None), self._last_replayed.pop(job_id, None))
            self._forgotten.move_to_end(job_id)
        while self._forgotten and (len(self._forgotten) > FORGOTTEN_KEPT_MAX
                                   or now - next(iter(self._forgotten.values()))[0] > FORGOTTEN_KEPT_S):
            self._forgotten.popitem(last=False)
        for per_job in (self._costs, self._incident_nodes):
            for gone in per_job.keys() - known:
                del per_job[gone]
