"""Prometheus metrics built from the monitor's live state at every scrape.

Nothing is kept in sync: each scrape diagnoses the jobs anew, so a job that is
forgotten simply stops appearing. No pid, stack text or error text becomes a label.
The job's label is ``job_id``: Prometheus reserves ``job`` for the scrape job.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from monitor.diagnosis import VERDICTS
from monitor.diagnosis.activity import ACTIVITIES

# Every word a rank's state can take: the activities plus "running" for a healthy job.
RANK_STATES = ("running", *ACTIVITIES)
from monitor.service import Monitor


class MonitorCollector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def describe(self) -> Iterable[object]:
        # Registering must not run a diagnosis; families are only known at scrape time.
        return []

    def collect(self) -> Iterable[object]:
        now = self.monitor.clock()
        results = self.monitor.results(now)

        verdict = GaugeMetricFamily(
            "hangwatch_job_verdict", "1 for the job's current verdict, 0 for the others", labels=["job_id", "verdict"]
        )
        stalled = GaugeMetricFamily(
            "hangwatch_job_stalled_seconds",
            "Seconds since the job last made progress (since first seen if it never did)",
            labels=["job_id"],
        )
        culprits = GaugeMetricFamily("hangwatch_job_culprit_ranks", "Number of culprit ranks", labels=["job_id"])
        world = GaugeMetricFamily("hangwatch_job_world_size", "World size the ranks report", labels=["job_id"])
        cpu_total = CounterMetricFamily(
            "hangwatch_rank_cpu_seconds", "CPU time the rank process used", labels=["job_id", "rank", "node"]
        )
        cpu_ratio = GaugeMetricFamily(
            "hangwatch_rank_cpu_ratio", "Rank CPU use over the last interval, 1 = one core", labels=["job_id", "rank", "node"]
        )
        step = GaugeMetricFamily("hangwatch_rank_step", "Last training step the rank's log showed", labels=["job_id", "rank"])
        up = GaugeMetricFamily("hangwatch_rank_alive", "1 while the rank process is alive", labels=["job_id", "rank", "node"])
        since_progress = GaugeMetricFamily(
            "hangwatch_rank_seconds_since_progress", "Seconds since the rank (or its job) last progressed", labels=["job_id", "rank"]
        )
        wait_ratio = GaugeMetricFamily(
            "hangwatch_rank_collective_wait_ratio",
            "Share of the rank's recent stack samples waiting in a collective (0-1)",
            labels=["job_id", "rank"],
        )
        rank_state = GaugeMetricFamily(
            "hangwatch_rank_state", "1 for the rank's current state, 0 for the others",
            labels=["job_id", "rank", "node", "state"],
        )
        culprit = GaugeMetricFamily(
            "hangwatch_rank_culprit", "1 if the diagnosis names this rank as a culprit", labels=["job_id", "rank"]
        )
        for result in results:
            view, d = result.view, result.diagnosis
            job = view.job_id
            for word in VERDICTS:
                verdict.add_metric([job, word], 1.0 if d.verdict == word else 0.0)
            last = result.last_progress_at if result.last_progress_at is not None else view.first_seen_at
            stalled.add_metric([job], max(0.0, now - last))
            culprits.add_metric([job], float(len(d.culprit_ranks)))
            world.add_metric([job], float(view.world_size))
            job_last = view.job_progress_times[-1] if view.job_progress_times else None
            states = {rd.rank: rd.state for rd in d.ranks}
            for r in view.ranks:
                current = states.get(r.rank, "unknown")
                for word in RANK_STATES:
                    rank_state.add_metric([job, str(r.rank), r.node, word], 1.0 if current == word else 0.0)
                culprit.add_metric([job, str(r.rank)], 1.0 if r.rank in d.culprit_ranks else 0.0)
            for r in view.ranks:
                rank = str(r.rank)
                seconds = result.cpu_seconds.get(r.rank)
                if seconds is not None:
                    cpu_total.add_metric([job, rank, r.node], seconds)
                if r.cpu_percent is not None:
                    cpu_ratio.add_metric([job, rank, r.node], r.cpu_percent / 100.0)
                if r.step is not None:
                    step.add_metric([job, rank], float(r.step))
                up.add_metric([job, rank, r.node], 1.0 if r.alive else 0.0)
                rank_last = r.progress_times[-1] if r.progress_times else job_last
                if rank_last is not None:
                    since_progress.add_metric([job, rank], max(0.0, now - rank_last))
                if r.collective_wait_share is not None:
                    wait_ratio.add_metric([job, rank], r.collective_wait_share)

        age = GaugeMetricFamily(
            "hangwatch_agent_last_report_age_seconds", "Seconds since the node's agent last reported", labels=["node"]
        )
        collector_up = GaugeMetricFamily(
            "hangwatch_agent_collector_up", "1 if the agent's collector worked in its last report", labels=["node", "collector"]
        )
        collector_errors = CounterMetricFamily(
            "hangwatch_agent_collector_errors", "Agent reports in which a collector failed", labels=["node", "collector"]
        )
        dump_failures = CounterMetricFamily(
            "hangwatch_agent_stack_dump_failures", "Rank entries reported with a failed py-spy dump", labels=["node"]
        )
        for node in self.monitor.nodes():
            age.add_metric([node.node], max(0.0, now - node.last_report_at))
            for name, ok in node.collectors:
                collector_up.add_metric([node.node, name], 1.0 if ok else 0.0)
                collector_errors.add_metric([node.node, name], float(dict(node.collector_errors).get(name, 0)))
            dump_failures.add_metric([node.node], float(node.stack_failures))

        reports = CounterMetricFamily("hangwatch_reports", "Agent reports accepted")
        reports.add_metric([], float(self.monitor.reports_total))
        rejected = CounterMetricFamily("hangwatch_reports_rejected", "Agent reports refused", labels=["reason"])
        for reason, count in sorted(self.monitor.rejected.items()):
            rejected.add_metric([reason], float(count))

        yield from (verdict, stalled, culprits, world, cpu_total, cpu_ratio, step, up, since_progress, wait_ratio)
        yield from (rank_state, culprit, age, collector_up, collector_errors, dump_failures, reports, rejected)


def build_registry(monitor: Monitor) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    return registry
