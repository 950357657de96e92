"""Signal orders for agents: a signal action becomes one order per culprit rank, handed to the
rank's node in the answer to its next report, and answered in a later report (order_results).

The monitor never reaches into a node: the agent that reports a rank is the only one that can
signal it, and only if its operator allowed that (agent/signal_orders.py). An order names the job
(as the rank's node spelled it), the rank, the pid and its start time; the agent signals only a
process its own discovery places there. An order not taken or not answered within ``ANSWER_S`` is
failed: its node stopped reporting (or its agent is too old).

A node that reports one live pid as two ranks (of one job or two) is lying about one of them: no
signal is ordered on its word about that pid (``ReportedPids``; the policy records the action as
unattributed, monitor/engine/actions/policy.py).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from monitor.ingest.job_track import JobTrack
from monitor.ingest.tracks import NodeTrack, RankKey

ANSWER_S = 30.0
# An order nobody took (its node stopped reporting) is dropped after this.
UNTAKEN_KEPT_S = 300.0


@dataclass
class _Batch:
    """The orders of one signal action, and what the agents said of each."""

    key: Any  # the caller's (the engine's) handle for the action
    created_at: float
    waiting: set[str]
    said: dict[str, tuple[bool, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Finished:
    key: Any
    ok: bool
    detail: str


class AgentOrders:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[str, list[dict[str, Any]]] = {}  # node -> orders not yet handed over
        self._batches: dict[str, _Batch] = {}  # order id -> its batch
        self._finished: list[Finished] = []
        self._given: dict[str, float] = {}  # order id -> when given (orders that need no answer)

    def order(self, key: Any, signal: str, targets: Iterable[tuple[str, str, int, int, float | None]],
              now: float) -> int:
        """Queue ``signal`` for each (node, job_id, rank, pid, started_at); returns how many orders.

        ``job_id`` is the id the node itself reported the rank under, not the id the monitor keeps
        the job under nor its aliases: the agent compares it with the id its discovery gives the pid
        (the same string it put in that report), so the exact spelling always matches, while other
        nodes' spellings (aliases joined by monitor/ingest/job_identity.py) could only widen what it takes."""
        batch = _Batch(key, now, set())
        with self._lock:
            for node, job_id, rank, pid, started_at in targets:
                order_id = f"{now:.0f}-{next(self._ids)}"
                batch.waiting.add(order_id)
                self._batches[order_id] = batch
                self._pending.setdefault(node, []).append({"id": order_id, "signal": signal, "job_id": job_id,
                                                           "rank": rank, "pid": pid, "started_at": started_at})
        return len(batch.waiting)

    def give(self, node: str, order: dict[str, Any], now: float) -> None:
        """An order that needs no answer (a capture: its upload is its answer)."""
        with self._lock:
            self._pending.setdefault(node, []).append(order)
            self._given[order["id"]] = now

    def expire(self, now: float) -> int:
        """Drop given orders their nodes never took (called each diagnosis pass); how many."""
        if not self._given:
            return 0
        with self._lock:
            old = {i for i, at in self._given.items() if now - at > UNTAKEN_KEPT_S}
            if not old:
                return 0
            for node in list(self._pending):
                kept = [o for o in self._pending[node] if o["id"] not in old]
                if kept:
                    self._pending[node] = kept
                else:
                    del self._pending[node]
            for order_id in old:
                del self._given[order_id]
        return len(old)

    def take(self, node: str) -> list[dict[str, Any]]:
        """The orders for ``node``'s agent, once (put in the answer to its report)."""
        if not self._pending:  # the common case, without the lock
            return []
        with self._lock:
            taken = self._pending.pop(node, [])
            for order in taken:
                self._given.pop(order["id"], None)
            return taken

    def answered(self, results: Iterable[Any]) -> None:
        """Results from a report (``order_results``): ids this monitor did not issue are ignored."""
        with self._lock:
            for result in results:
                batch = self._batches.pop(result.id, None)
                if batch is None:
                    continue
                batch.waiting.discard(result.id)
                batch.said[result.id] = (result.ok, result.detail)
                if not batch.waiting:
                    self._finish(batch)

    def finished(self, now: float) -> list[Finished]:
        """Actions whose orders are all answered, or past ANSWER_S (then failed for the rest), once."""
        with self._lock:
            for order_id, batch in list(self._batches.items()):
                if now - batch.created_at >= ANSWER_S and order_id in batch.waiting:
                    batch.waiting.discard(order_id)
                    batch.said[order_id] = (False, f"no answer from the rank's agent within {ANSWER_S:.0f}s")
                    del self._batches[order_id]
                    for orders in self._pending.values():
                        orders[:] = [o for o in orders if o["id"] != order_id]
                    if not batch.waiting:
                        self._finish(batch)
            out, self._finished = self._finished, []
        return out

    def _finish(self, batch: _Batch) -> None:
        results = [batch.said[k] for k in sorted(batch.said)]
        ok = all(r[0] for r in results)
        self._finished.append(Finished(batch.key, ok, "; ".join(detail for _, detail in results)))


class ReportedPids:
    """The live ranks each node's latest report names, by pid, to tell a node that reports one
    process as two ranks.

    Asked only for a verdict's culprits, when an action may follow: each culprit's node is indexed
    once, from its rank keys (the ranks of its latest report: O(that node's ranks)), so ingest pays
    nothing and no pass walks every rank the monitor knows.
    """

    def __init__(self, nodes: Mapping[str, NodeTrack], jobs: Mapping[str, JobTrack]) -> None:
        self.nodes = nodes
        self.jobs = jobs
        self._by_node: dict[str, dict[int, list[RankKey]]] = {}

    def conflict(self, node: str, job_id: str, rank: int, pid: int | None) -> str | None:
        """Why ``node``'s word that ``pid`` is ``rank`` of ``job_id`` cannot be trusted; None: it can."""
        if pid is None:
            return None
        by_pid = self._by_node.get(node)
        if by_pid is None:
            by_pid = self._by_node[node] = self._index(node)
        other = next((key for key in by_pid.get(pid, ()) if key != (job_id, rank)), None)
        if other is None:
            return None
        return (f"node {node} reports pid {pid} as rank {rank} of job {job_id} and as rank {other[1]} of job "
                f"{other[0]}: one process is one rank of one job, so it is lying about one of them")

    def _index(self, node: str) -> dict[int, list[RankKey]]:
        by_pid: dict[int, list[RankKey]] = {}
        reported = self.nodes.get(node)
        for job_id, rank in reported.rank_keys if reported is not None else ():
            job = self.jobs.get(job_id)
            track = job.ranks.get(rank) if job is not None else None
            # Ended ranks are left out: a pid the kernel gave again to a new process is no lie.
            if track is not None and track.alive and track.node == node:
                by_pid.setdefault(track.pid, []).append((job_id, rank))
        return by_pid
