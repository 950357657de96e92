"""The monitor's core: accepted reports in, diagnosed jobs out, verdict changes recorded.

Routes, the metrics collector and the background tick all go through ``Monitor``;
it owns the in-memory state and writes through to the ``Store``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

import pydantic

import monitor.diagnosis as diagnosis
from monitor.diagnosis import Diagnosis, JobView
from monitor.state import MonitorState
from monitor.store import Store, VerdictChange
from monitor.views import job_view
from monitor.fastwire import decode_report

log = logging.getLogger("hangwatch.monitor")

REJECT_REASONS = ("content_type", "too_large", "invalid_json", "schema")


@dataclass(frozen=True)
class JobResult:
    view: JobView
    diagnosis: Diagnosis
    last_report_at: float
    last_progress_at: float | None
    cpu_seconds: dict[int, float | None]


@dataclass(frozen=True)
class NodeSummary:
    node: str
    last_report_at: float
    collectors: tuple[tuple[str, bool], ...]
    collector_errors: tuple[tuple[str, int], ...] = ()
    stack_failures: int = 0


class Monitor:
    def __init__(
        self,
        store: Store,
        job_retention_s: float = 600.0,
        clock: Callable[[], float] = time.time,
        diagnose: Callable[[JobView], Diagnosis] | None = None,
    ) -> None:
        self.store = store
        self.job_retention_s = job_retention_s
        self.clock = clock
        self._diagnose = diagnose
        self.state = MonitorState()
        # Routes run on the event loop, but the lock keeps the state whole should any
        # caller (a threadpool route, a test) come from another thread.
        self._lock = threading.RLock()
        self.reports_total = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self._last_verdicts: dict[str, tuple[str, tuple[int, ...]]] = {}

    # --- ingest ---

    def ingest(self, report: Any, body: str, received_at: float | None = None) -> None:
        received_at = self.clock() if received_at is None else received_at
        with self._lock:
            self.state.apply(report, received_at)
            self.reports_total += 1
        self.store.add_report(report.node, received_at, body)

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def replay(self) -> int:
        """Rebuild state from the stored recent reports, oldest first; return how many were replayed."""
        since = self.clock() - self.store.report_retention_s
        count = 0
        with self._lock:
            for stored in self.store.recent_reports(since):
                try:
                    report = decode_report(stored.body)
                except pydantic.ValidationError:
                    log.warning("skipping a stored report from %s that no longer validates", stored.node)
                    continue
                self.state.apply(report, stored.received_at)
                count += 1
            for job_id, change in self.store.latest_verdicts().items():
                self._last_verdicts[job_id] = (change.verdict, change.culprit_ranks)
        return count

    # --- diagnosis ---

    def results(self, now: float | None = None, job_id: str | None = None) -> list[JobResult]:
        """Diagnose every known job (or one) at ``now``; most recently active job first."""
        now = self.clock() if now is None else now
        with self._lock:
            self.state.prune(now, self.job_retention_s)
            if job_id is not None:
                job_id = self.state.resolve(job_id)  # another node's spelling of the id
            jobs = [j for j in self.state.jobs.values() if job_id is None or j.job_id == job_id]
            results = []
            for job in jobs:
                view = job_view(job, self.state.nodes, now)
                results.append(
                    JobResult(
                        view=view,
                        diagnosis=self._run_diagnosis(view),
                        last_report_at=job.last_report_at,
                        last_progress_at=job.last_progress_at,
                        cpu_seconds={r: t.latest.cpu_seconds for r, t in job.ranks.items()},
                    )
                )
            self._record_changes(results, now)
        results.sort(key=lambda r: (-r.last_report_at, r.view.job_id))
        return results

    def tick(self, now: float | None = None) -> None:
        """Diagnose everything once so verdict changes are recorded even while nobody asks."""
        self.results(now)

    def _run_diagnosis(self, view: JobView) -> Diagnosis:
        diagnose = self._diagnose or diagnosis.diagnose
        try:
            return diagnose(view)
        except Exception:
            # One job tripping a rule must not blank the page or the scrape for every job.
            log.exception("diagnosis failed for job %s", view.job_id)
            return Diagnosis("stalled", (), None, "diagnosis failed inside the monitor (see its log)")

    def _record_changes(self, results: list[JobResult], now: float) -> None:
        for result in results:
            d = result.diagnosis
            key = (d.verdict, tuple(d.culprit_ranks))
            job_id = result.view.job_id
            if self._last_verdicts.get(job_id) != key:
                self._last_verdicts[job_id] = key
                self.store.add_verdict(VerdictChange(job_id, now, d.verdict, key[1], d.summary))

    def history(self, job_id: str) -> list[VerdictChange]:
        with self._lock:
            job_id = self.state.resolve(job_id)
        return self.store.verdict_history(job_id)

    def knows_job(self, job_id: str) -> bool:
        with self._lock:
            return self.state.resolve(job_id) in self.state.jobs

    def nodes(self) -> list[NodeSummary]:
        with self._lock:
            return [
                NodeSummary(
                    n.node,
                    n.last_report_at,
                    tuple((c.name, c.ok) for c in n.collectors),
                    tuple(sorted(n.collector_errors.items())),
                    n.stack_failures,
                )
                for n in sorted(self.state.nodes.values(), key=lambda n: n.node)
            ]
