"""Prometheus metrics from the monitor's latest diagnoses, rendered at scrape time.

Nothing is kept in sync: each scrape renders the jobs of the latest diagnosis pass (see
``Monitor.results``), so a job that is forgotten simply stops appearing. No pid, stack text
or error text becomes a label. The job's label is ``job_id``: Prometheus reserves ``job``
for the scrape job. The families are written by ``monitor.web.exposition``; the per-job ones (most
of a scrape: 4,000 ranks in jobs of 64 are ~74,000 series) by ``monitor.web.job_series``, which
keeps each job's text while its result stands. The monitor's own health is under
``hangwatch_monitor_*``. Times are Unix timestamps (``*_timestamp_seconds``), never ages: PromQL
takes ``time() - x``, and a late scrape cannot show a wrong age. A silent node keeps its series (its last report time frozen) for as long
as the monitor remembers it, so the alert on it holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from monitor.web.exposition import Family, labels, number, render
from monitor.web.http_guard import HttpStats
from monitor.web.job_series import JOB_FAMILIES, JOB_INFO_LABELS, RANK_LABELS, RANK_STATES, JobSeries, job_chunks
from monitor.web.load import LAG_BUCKETS, LoadGuard
from monitor.web.process_metrics import build_info, process_families
from monitor.engine.incidents import SuspectNode
from monitor.engine.published import JobResult, MonitorFigures
from monitor.engine.readiness import REASONS, Readiness
from monitor.storage.capture_store import REFUSAL_REASONS


def render_metrics(results: Sequence[JobResult], figures: MonitorFigures, suspects: Sequence[SuspectNode],
                   load: Sequence[Family], http: Sequence[Family], series: JobSeries | None = None) -> bytes:
    """The scrape, from what the engine published (``results``, ``figures``: immutable) and the web
    layer's own families taken on the event loop (``load_families``, ``http_families``): it touches
    nothing live, so it runs on a worker thread while reports keep arriving. ``series``: the jobs'
    text kept from earlier scrapes (monitor/web/job_series.py); without it every job is written anew."""
    job_families = [Family(name, help_text, kind) for name, help_text, kind in JOB_FAMILIES]
    for chunks in (series.chunks(results) if series is not None else [job_chunks(r) for r in results]):
        for family, chunk in zip(job_families, chunks):
            if chunk:
                family.lines.append(chunk)  # the job's lines of the family, joined

    last_report = Family("hangwatch_agent_last_report_timestamp_seconds",
                         "Unix time the monitor last took a report from the node's agent (kept for a day "
                         "after it falls silent)")
    collector_up = Family("hangwatch_agent_collector_up", "1 if the agent's collector worked in its last report")
    collector_errors = Family("hangwatch_agent_collector_errors", "Agent reports in which a collector failed",
                              "counter")
    dump_failures = Family("hangwatch_agent_stack_dump_failures", "Rank entries reported with a failed py-spy dump",
                           "counter")
    agent_cpu = Family("hangwatch_agent_cpu_ratio", "The agent's own CPU use (py-spy included) over its last tick, "
                                                     "1 = one core")
    agent_memory = Family("hangwatch_agent_memory_bytes", "The agent's resident memory")
    for node in figures.node_summaries:
        node_l = labels(("node",), (node.node,))
        last_report.add(node_l, node.last_report_at)
        if node.agent_cpu_percent is not None:
            agent_cpu.add(node_l, node.agent_cpu_percent / 100.0)
        if node.agent_rss_bytes is not None:
            agent_memory.add(node_l, float(node.agent_rss_bytes))
        errors = dict(node.collector_errors)
        for name, ok in node.collectors:
            node_collector = labels(("node", "collector"), (node.node, name))
            collector_up.add(node_collector, 1.0 if ok else 0.0)
            collector_errors.add(node_collector, float(errors.get(name, 0)))
        dump_failures.add(node_l, float(node.stack_failures))

    reports = Family("hangwatch_reports", "Agent reports accepted", "counter")
    reports.add("", float(figures.reports_total))
    rejected = Family("hangwatch_reports_rejected", "Agent reports refused", "counter")
    for reason, count in figures.rejected:
        rejected.add(labels(("reason",), (reason,)), float(count))

    families = [build_info(), *job_families, last_report, collector_up, collector_errors,
                dump_failures, agent_cpu, agent_memory, reports, rejected]
    return render([*families, *own_families(figures, suspects, load), *http, *process_families()])


def load_families(guard: LoadGuard) -> list[Family]:
    """The event loop's load, read on the event loop (where the guard's probes write it)."""
    shed = Family("hangwatch_monitor_reports_shed",
                  "Reports refused with 503 because the monitor was past capacity", "counter")
    shed.add("", float(guard.shed_total))
    lag = Family("hangwatch_monitor_event_loop_lag_seconds", "How late the event loop ran over the last second")
    lag.add("", guard.lag_s)
    lag_probes = lag_histogram(guard)
    overloaded = Family("hangwatch_monitor_overloaded", "1 while the monitor sheds reports (loop lag past the limit)")
    overloaded.add("", 1.0 if guard.overloaded else 0.0)
    return [shed, lag, lag_probes, overloaded]


def own_families(figures: MonitorFigures, suspects: Sequence[SuspectNode], load: Sequence[Family]) -> list[Family]:
    """The monitor's own load: is it keeping up with its agents."""
    store = figures.store
    full = Family("hangwatch_monitor_full_reports", "Accepted reports that were full (not deltas)", "counter")
    full.add("", float(figures.full_reports_total))
    deferred = Family("hangwatch_monitor_deltas_deferred",
                      "Deltas from nodes owing their full report, answered (send the full one) and not applied "
                      "while the monitor was behind", "counter")
    deferred.add("", float(figures.deltas_deferred))
    pass_s = Family("hangwatch_monitor_diagnosis_pass_seconds", "Wall time of the last diagnosis pass over all jobs")
    pass_s.add("", figures.last_pass_s)
    pass_at = Family("hangwatch_monitor_last_diagnosis_timestamp_seconds", "Unix time the last diagnosis pass ended")
    if figures.last_pass_at is not None:
        pass_at.add("", figures.last_pass_at)
    snapshots = Family("hangwatch_monitor_snapshots_written", "Node snapshots written to the database", "counter")
    snapshots.add("", float(store.snapshots_written))
    backlog = Family("hangwatch_monitor_store_backlog", "Database writes queued and not yet committed")
    backlog.add("", float(store.backlog))
    replayed = Family("hangwatch_monitor_reports_replayed",
                      "Reports agents kept through an outage, applied late at their own times", "counter")
    replayed.add("", float(figures.replayed_total))
    replay_dropped = Family("hangwatch_monitor_reports_replay_dropped",
                            "Reports kept through an outage that came too late to apply", "counter")
    replay_dropped.add("", float(figures.replayed_dropped))
    store_up = Family("hangwatch_monitor_store_up",
                      "1 while the database takes the monitor's writes; 0: history is held in memory")
    store_up.add("", 1.0 if store.ok else 0.0)
    in_memory = Family("hangwatch_monitor_store_in_memory",
                       "1 when the database could not be opened: nothing survives a restart")
    in_memory.add("", 1.0 if store.in_memory else 0.0)
    write_failures = Family("hangwatch_monitor_store_write_failures",
                            "Database transactions that failed, by reason (disk_full, read_only, locked, ...)",
                            "counter")
    for reason, count in store.write_failures:
        write_failures.add(labels(("reason",), (reason,)), float(count))
    unsaved = Family("hangwatch_monitor_store_unsaved_changes", "Verdict changes held in memory, not yet written")
    unsaved.add("", float(store.unsaved))
    dropped = Family("hangwatch_monitor_snapshots_dropped",
                     "Node snapshots not written (the database failing or far behind)", "counter")
    dropped.add("", float(store.snapshots_dropped))
    refused = Family("hangwatch_monitor_snapshots_refused",
                     "Node snapshots not kept, by reason: too_large (over snapshot_max_bytes compressed), "
                     "over_budget (a new node's while snapshots fill snapshot_budget_bytes), low_space (the "
                     "database's volume had less than min_free_bytes free)", "counter")
    refused.add(labels(("reason",), ("too_large",)), float(store.snapshots_too_large))
    refused.add(labels(("reason",), ("over_budget",)), float(store.snapshots_over_budget))
    refused.add(labels(("reason",), ("low_space",)), float(store.snapshots_low_space))
    snapshot_bytes = Family("hangwatch_monitor_snapshot_bytes", "Compressed bytes the stored node snapshots take")
    if store.snapshot_bytes is not None:
        snapshot_bytes.add("", float(store.snapshot_bytes))
    displaced = Family("hangwatch_monitor_jobs_displaced",
                       "Jobs forgotten at max_jobs, silent for a minute or more, to let new ones in", "counter")
    displaced.add("", float(figures.jobs_displaced))
    claims = Family("hangwatch_monitor_rank_claims_refused",
                    "Reported ranks ignored: another node that still reports runs them", "counter")
    claims.add("", float(figures.claims_refused))
    incidents = Family("hangwatch_node_incidents",
                       "Incidents (an alarm, or a rank that ended or stopped) that named a rank of the node as a "
                       "culprit, by the verdict that named it, since the monitor started", "counter")
    for (node, verdict), count in figures.node_incidents:
        incidents.add(labels(("node", "verdict"), (node, verdict)), float(count))
    node_lost = Family("hangwatch_node_lost_gpu_seconds",
                       "GPU-seconds jobs lost to incidents whose culprits ran on the node (split among the "
                       "culprits' nodes; node=\"unattributed\": no culprit named), since the monitor started",
                       "counter")
    for (node, verdict), seconds in figures.node_lost_gpu_seconds:
        node_lost.add(labels(("node", "verdict"), (node, verdict)), seconds)
    culprit_jobs = Family("hangwatch_node_culprit_jobs",
                          "Distinct jobs whose incidents named the node as a culprit within the suspect window "
                          "(HANGWATCH_SUSPECT_WINDOW_S, 7 days by default): a drain candidate when several")
    for suspect in suspects:
        culprit_jobs.add(labels(("node",), (suspect.node,)), float(len(suspect.jobs)))
    ranks = Family("hangwatch_monitor_ranks", "Ranks the monitor tracks (those summarising relays summarise too)")
    ranks.add("", float(figures.ranks))
    summaries = Family("hangwatch_monitor_summaries", "Summaries taken from summarising relays (hangwatch-relay "
                       "--summarise)", "counter")
    summaries.add("", float(figures.summaries_total))
    relay_age = Family("hangwatch_monitor_relay_summary_age_seconds", "Seconds since each summarising relay's last "
                       "summary (past 5 s its nodes' ranks read as silent)")
    relay_nodes = Family("hangwatch_monitor_relay_nodes", "Nodes each summarising relay summarises")
    for relay, last_at, nodes in figures.summarising_relays:
        relay_age.add(labels(("relay",), (relay,)), max(0.0, figures.at - last_at))
        relay_nodes.add(labels(("relay",), (relay,)), float(nodes))
    actions = Family("hangwatch_actions",
                     "Decisions of the opt-in actions' rules (--actions), by rule, kind and outcome (ok, failed, "
                     "dry_run, rate_limited, unattributed, skipped, refused), since the monitor started", "counter")
    if figures.action_counts is not None:
        for (rule, kind, outcome), count in figures.action_counts:
            actions.add(labels(("rule", "kind", "outcome"), (rule, kind, outcome)), float(count))
    captures = Family("hangwatch_capture_requests", "Evidence captures asked of a job's agents (one per incident "
                      "held past --capture-after), since the monitor started", "counter")
    parts = Family("hangwatch_capture_parts", "Agents' capture parts received or refused (too big, not asked, "
                   "a second time), since the monitor started", "counter")
    parts_refused = Family("hangwatch_capture_parts_refused",
                           "Agents' capture parts refused, by reason: expired (no such bundle), not_asked, "
                           "already_sent, too_large, low_space (the captures' volume had less than min_free_bytes "
                           "free), failed (the upload broke off), since the monitor started", "counter")
    kept = Family("hangwatch_capture_bytes", "Bytes of capture bundles kept on disk")
    if figures.captures is not None:
        captures.add("", float(figures.captures.requested))
        parts.add(labels(("outcome",), ("received",)), float(figures.captures.parts_received))
        parts.add(labels(("outcome",), ("refused",)), float(figures.captures.parts_refused))
        refusals = dict(figures.captures.refusals)
        for reason in REFUSAL_REASONS:
            parts_refused.add(labels(("reason",), (reason,)), float(refusals.get(reason, 0)))
        kept.add("", float(figures.captures.total_bytes))
    return [full, deferred, *load, pass_s, pass_at, snapshots, backlog, replayed, replay_dropped, store_up,
            in_memory, write_failures, unsaved, dropped, refused, snapshot_bytes, displaced, claims, incidents, node_lost,
            culprit_jobs, ranks, summaries, relay_age, relay_nodes, actions,
            captures, parts, parts_refused, kept, *readiness_families(figures.readiness)]


def readiness_families(readiness: Readiness | None) -> list[Family]:
    """What /readyz says (monitor/engine/readiness.py). The volumes' free bytes are node_exporter's
    (node_filesystem_avail_bytes) or the kubelet's (kubelet_volume_stats_available_bytes), not repeated here."""
    ready = Family("hangwatch_monitor_ready", "1 while /readyz answers 200: the store takes writes, its volumes have "
                   "min_free_bytes free, no load is shed and no rebuild after a restart is under way")
    not_ready = Family("hangwatch_monitor_not_ready", "1 for each reason /readyz gives now: store_not_writable, "
                       "volume_nearly_full, shedding_load, rebuilding")
    if readiness is not None:
        ready.add("", 1.0 if readiness.ready else 0.0)
        now = {r.reason for r in readiness.reasons}
        for reason in REASONS:
            not_ready.add(labels(("reason",), (reason,)), 1.0 if reason in now else 0.0)
    return [ready, not_ready]


def lag_histogram(guard: LoadGuard) -> Family:
    """Every 50 ms probe's lateness: ``histogram_quantile(0.99, rate(..._bucket[5m]))`` is the loop's lag p99."""
    family = Family("hangwatch_monitor_event_loop_probe_lag_seconds",
                    "How late each 50 ms probe of the event loop fired", "histogram")
    cumulative = 0
    for bound, count in zip((*LAG_BUCKETS, math.inf), guard.lag_counts):
        cumulative += count
        family.lines.append(f'{family.name}_bucket{{le="{number(bound)}"}} {cumulative}')
    family.lines.append(f"{family.name}_sum {number(guard.lag_sum_s)}")
    family.lines.append(f"{family.name}_count {cumulative}")
    return family


def http_families(http: HttpStats) -> list[Family]:
    """What the token checks and connection guards turned away."""
    unauthorized = Family("hangwatch_monitor_requests_unauthorized",
                          "Requests refused with 401 (no or a wrong token), by kind: ingest, read, metrics, relay", "counter")
    for kind, count in sorted(http.unauthorized.items()):
        unauthorized.add(labels(("kind",), (kind,)), float(count))
    open_connections = Family("hangwatch_monitor_connections", "HTTP connections open now")
    open_connections.add("", float(http.open_connections))
    closed = Family("hangwatch_monitor_connections_closed",
                    "Connections the monitor closed to protect itself: header_timeout, body_timeout "
                    "(too slow), evicted_idle (room for a new one), refused_full (every slot busy)", "counter")
    for reason, count in sorted(http.closed.items()):
        closed.add(labels(("reason",), (reason,)), float(count))
    return [unauthorized, open_connections, closed]


__all__ = ["JOB_INFO_LABELS", "RANK_LABELS", "RANK_STATES", "http_families", "load_families", "render_metrics"]
