"""When to ask a job's agents for a capture (monitor/storage/capture_store.py): once per incident, when
its verdict (an alarm, a rank that exited or stopped) has held ``after_s``, before a watchdog
kills the job and the evidence with it. Each node holding ranks of the job gets one order, in
the answer to its next report (monitor/engine/actions/orders.py), naming the ranks' pids and where to
upload; the agents capture in parallel, each its own ranks."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from monitor.engine.actions.orders import AgentOrders
from monitor.storage.capture_store import CAPTURE_UPLOAD_PREFIX, CaptureStore
from monitor.engine.incidents import ENDS_INCIDENT, INCIDENT_VERDICTS
from monitor.ingest.job_track import JobTrack

log = logging.getLogger("hangwatch.captures")
UPLOAD_PREFIX = CAPTURE_UPLOAD_PREFIX


@dataclass
class _Incident:
    started_at: float
    captured: bool = False


class CaptureRequests:
    def __init__(self, store: CaptureStore, orders: AgentOrders, after_s: float) -> None:
        self.store, self.orders, self.after_s = store, orders, after_s
        self._incidents: dict[str, _Incident] = {}
        self.requested = 0

    def observe(self, job: JobTrack, verdict: str, culprits: tuple[int, ...], now: float) -> str | None:
        """A published, live verdict of ``job``; the bundle id when a capture is asked now."""
        if verdict in ENDS_INCIDENT:
            self._incidents.pop(job.job_id, None)
            return None
        if verdict not in INCIDENT_VERDICTS:
            return None
        incident = self._incidents.setdefault(job.job_id, _Incident(now))
        if incident.captured or now - incident.started_at < self.after_s:
            return None
        incident.captured = True
        nodes: dict[str, list[int]] = {}
        for track in job.ranks.values():
            nodes.setdefault(track.node, []).append(track.pid)
        bundle = self.store.open_bundle(job.job_id, verdict, list(culprits), incident.started_at, nodes)
        for node, pids in nodes.items():
            # One id per bundle and node, whatever their lengths (an order id is at most 64 characters).
            order_id = "capture-" + hashlib.sha256(f"{bundle.id}/{node}".encode()).hexdigest()[:32]
            self.orders.give(node, {"id": order_id, "capture": {
                "bundle": bundle.id, "job_id": job.job_id, "pids": sorted(pids),
                "upload": f"{UPLOAD_PREFIX}{bundle.id}/{node}"}}, now)
        self.requested += 1
        log.info("capture %s asked of %d nodes (%s held %.0fs)", bundle.id, len(nodes), verdict,
                 now - incident.started_at)
        return bundle.id

    def keep_only(self, job_ids: set[str]) -> None:
        for gone in set(self._incidents) - job_ids:
            del self._incidents[gone]
