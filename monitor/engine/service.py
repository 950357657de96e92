"""The monitor's engine: accepted reports in, diagnosed jobs published, verdict changes recorded.

``Monitor`` owns the live records (monitor/ingest/) behind its lock and writes through to the
``Store``. What it hands out is published (monitor/engine/published.py): immutable results and
copies of its figures, which routes, answers and /metrics read without a lock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import pydantic

import monitor.diagnosis as diagnosis
from monitor.diagnosis import Diagnosis, JobView, RankView
from monitor.diagnosis.held import HELD_MIN_S
from monitor.diagnosis.stability import ALARMS, Settled, settle
from monitor.ingest.fastwire import decode_report
from monitor.ingest.full_pacing import FullReportPacer
from monitor.ingest.job_track import JobTrack
from monitor.ingest.limits import Limits, Refusal, check_report
from monitor.engine.published import (JobResult, MonitorFigures, MonitorStatus, NodeSummary, RankConflict,
                                       TimelineSpans)
from monitor.engine.engine_settings import EngineSettings
from monitor.engine.figures import capture_figures, node_summaries
from monitor.engine.summaries import SummaryAnswer, SummaryIntake, check_summary
from monitor.engine.readiness import Readiness, RebuildProgress, decide
from monitor.engine.rank_timeline import RankTimeline
from monitor.engine.verdict_ledger import VerdictLedger
from monitor.ingest.state import MonitorState
from monitor.ingest.summary_book import merged_view
from monitor.ingest.summary_wire import DETAIL_RANKS_MAX, Summary
from monitor.engine.incidents import ENDS_INCIDENT, SuspectNode, incidents, suspect_nodes
from monitor.engine.actions.orders import AgentOrders, ReportedPids
from monitor.engine.actions.policy import Culprit, JobFacts
from monitor.engine.attribution import why_unattributed
from monitor.ingest.report_order import stale_reason
from monitor.ingest.silent_budget import SilentBudget
from monitor.storage.store import Store, VerdictChange

if TYPE_CHECKING:
    from monitor.engine.actions.engine import ActionEngine
    from monitor.engine.capture_requests import CaptureRequests
from monitor.engine.views import held_since, job_view, rank_view

log = logging.getLogger("hangwatch.monitor")

# A healthy job that progressed within ADVANCING_S cannot be stalled yet (no stall rule fires
# before MIN_STALL_S, 3.5 s, of silence), so until something in its lifecycle changes, its
# diagnosis is refreshed only every REFRESH_S: at 10,000 ranks that is most of the work saved.
ADVANCING_S = 2.0
# A held rank's job is diagnosed at every pass from this long before the least allowance ends.
HELD_LEAD_S = 1.0
REFRESH_S = 5.0

# Jobs of more ranks than this are diagnosed off the event loop (``Monitor._giant_job_steps``)
# and their answers rendered on a worker thread (monitor/web/routes/diagnose.py).
GIANT_JOB_RANKS = 500
# Ranks whose views a pass takes between two chances for requests to run.
VIEW_CHUNK = 500

# A report kept through an outage longer ago than this is not applied (its verdicts are history
# nobody will page on, and the state it would set up is long gone).
MAX_REPLAY_AGE_S = 3600.0
# Suspect nodes (monitor/engine/incidents.py, over the suspect_window_s setting) are read from the
# database again at most this often for /metrics.
SUSPECTS_REFRESH_S = 60.0
REJECT_REASONS = ("content_type", "too_large", "invalid_json", "schema", "disconnected", "unauthorized",
                  "wrong_node", "world_size", "too_many_nodes", "too_many_jobs", "too_many_ranks", "node_jobs", "stale")


# The setting each make-room reason is named by in the log.
_LIMIT_NAMES = {"node_jobs": "max_jobs_per_node", "too_many_jobs": "max_jobs", "too_many_ranks": "max_ranks"}


@dataclass(frozen=True)
class Offload:
    """Work a diagnosis pass hands back to its caller to run where it likes (the app: a worker
    thread); it touches no shared state and takes no lock."""

    run: Callable[[], None]


@dataclass(frozen=True)
class IngestAnswer:
    # Ask the agent for a full report next time: it sent a delta this monitor cannot build
    # on (a restart, a forgotten node) or the node's snapshot is due.
    send_full: bool
    # ... in this many seconds, sending deltas until then: a herd of them is spread
    # (monitor/ingest/full_pacing.py); 0 with a snapshot due, or outside a herd.
    full_in_s: float = 0.0


class Monitor:
    """State, diagnosis and persistence behind every route.

    Diagnosis runs in passes: the background tick diagnoses every job that may have changed
    (verdicts change with time alone; a healthy, advancing job only every REFRESH_S unless
    its lifecycle changed), and a read re-diagnoses only the jobs reports changed since,
    while they are few (``fresh_read_ranks``); past that, reads answer from the last pass,
    at most about a tick old. Reads thus cost the same whether 10 or 10,000 ranks report.
    With the tick off (``tick_interval_s`` 0, the tests) every read diagnoses anew.
    """

    def __init__(
        self,
        store: Store,
        settings: EngineSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        diagnose: Callable[[JobView], Diagnosis] | None = None,
        orders: AgentOrders | None = None,
        actions: ActionEngine | None = None,
        captures: CaptureRequests | None = None,
        after_giant_diagnosis: Callable[[JobResult], Callable[[], None] | None] | None = None,
        overloaded: Callable[[], bool] | None = None,
        **tuning: Any,
    ) -> None:
        """``settings``: the monitor's, as declared (monitor/engine/engine_settings.py). Built bare (unit
        tests, benchmarks) no background pass drives it (``tick_interval_s`` 0): every read diagnoses
        anew. ``overloaded``: whether the web face sheds reports now (monitor/web/load.py), for readiness.
        ``tuning``: settings of those names replaced (``confirm_alarms=False``)."""
        settings = settings if settings is not None else EngineSettings(tick_interval_s=0.0)
        if tuning:
            settings = dataclasses.replace(settings, **tuning)
        self.settings = settings
        self.store = store
        self.limits: Limits = settings
        # What silent jobs and nodes keep, bounded (monitor/ingest/silent_budget.py).
        self._silent_budget = SilentBudget(settings.max_silent_bytes)
        self.clock = clock
        # Reports received before this were replayed from the store (see JobView.monitor_started_at).
        self.started_at = clock()
        self._diagnose = diagnose
        # Alarms are published once their raw verdicts last (monitor.diagnosis.stability);
        # off, every raw verdict is published as it comes (unit tests of single readings).
        self._settled: dict[str, Settled] = {}
        self._state = MonitorState(cpu_level_window_s=settings.straggler_window_s)
        # Each rank's diagnosed state over the recent past, for the page's timeline.
        self._timeline = RankTimeline()
        # Routes run on the event loop, but the lock keeps the state whole should any
        # caller (a threadpool route, a test) come from another thread.
        self._lock = threading.RLock()
        self.reports_total = 0
        # Reports agents kept through an outage: applied late at their own times, or too old to use.
        self.replayed_total = 0
        self.replayed_dropped = 0
        self.full_reports_total = 0
        # Deltas answered without being applied (``answer_owed_delta``).
        self.deltas_deferred = 0
        # Jobs forgotten at max_jobs to let new ones in (monitor/ingest/retention.make_room_for_jobs).
        self.jobs_displaced = 0
        self._rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        # History rows, incidents per node and what hangs cost, as verdicts are published.
        self._ledger = VerdictLedger(store)
        # The latest diagnosis of each job, and the jobs reports changed since theirs.
        self._results: dict[str, JobResult] = {}
        self._dirty: set[str] = set()
        # The job's lifecycle_revision at its latest diagnosis.
        self._revisions: dict[str, int] = {}
        self.last_pass_at: float | None = None
        self.last_pass_s = 0.0
        # When each node's next snapshot is due; the nodes that sent a full report to this process.
        self._snapshot_due: dict[str, float] = {}
        self._full_seen: set[str] = set()
        # Asked as a giant job's new diagnosis is stored: the work to run next on a worker thread,
        # if any (the app renders a watched job's answer there, monitor/present/answers.py); pure work on
        # the immutable result.
        self.after_giant_diagnosis = after_giant_diagnosis
        # Suspect nodes over this window for /metrics, and when they were last read (cached_suspect_nodes).
        self._suspects: tuple[float, list[SuspectNode]] | None = None
        # Orders for agents, in the answers to their reports (monitor/engine/actions/orders.py).
        self.orders = orders if orders is not None else AgentOrders()
        # Opt-in actions (monitor/engine/actions/): when an actions file is given; they queue orders.
        self.actions = actions
        # Evidence captured per incident (monitor/engine/capture_requests.py): unless off.
        self.captures = captures
        self._overloaded = overloaded
        # The nodes replay() restored, and those of them not heard from in full since (monitor/engine/readiness.py).
        self._restored_nodes = 0
        self._awaiting_restored: set[str] = set()
        # When each node owing a full report sends it, a herd spread (monitor/ingest/full_pacing.py).
        self._full_pacer = FullReportPacer()
        # Giant jobs' shares from summarising relays (monitor/engine/summaries.py).
        self._summaries = SummaryIntake()

    # --- ingest ---

    def ingest(self, report: Any, received_at: float | None = None, attributed: bool = False) -> IngestAnswer:
        """Apply one decoded report (``monitor.ingest.fastwire``); it is kept as a snapshot when due.

        The snapshot is the validated report encoded again, never the body as received: fields
        validation drops (unknown keys, padding) are not stored, so the database holds only what
        the schema bounds (an 8 MiB padded report once grew it by gigabytes).
        ``attributed``: it came with a token bound to its node (monitor/web/auth.py), so no other node
        could have sent it; opt-in actions act only on jobs whose nodes all report so.
        """
        received_at = self.clock() if received_at is None else received_at
        if report.replayed:
            return self._ingest_replayed(report, received_at, attributed)
        node = report.node
        with self._lock:
            touched = self._state.apply(report, received_at)
            self._state.nodes[node].attributed = attributed
            if report.delta and node not in self._full_seen:
                # A delta on a picture this process did not get from the agent (after a restart: an
                # old snapshot and the outage's replays; fields that changed before the outage and
                # not since are stale): not the node's present until its full report, a second away.
                self._state.nodes[node].partial = True
            self._dirty |= touched
            self.reports_total += 1
            due = self._snapshot_due.get(node)
            snapshot_due = due is None or received_at >= due
            if not report.delta:
                first_full = node not in self._full_seen
                self._full_seen.add(node)
                self._awaiting_restored.discard(node)
                self._full_pacer.paid(node)
                self.full_reports_total += 1
                if snapshot_due:
                    self.store.add_snapshot(node, received_at, msgspec.json.encode(report))
                if snapshot_due or first_full:
                    # After a restart the snapshot restored is less than an interval old: the next full
                    # report is asked for an interval on, not a few seconds after this one.
                    self._snapshot_due[node] = received_at + self.settings.snapshot_interval_s * _spread(node)
            # A delta builds on a picture this process may not have (it restarted, or forgot
            # the node): it asks until a full report arrives, so a lost answer costs nothing.
            missing_full = node not in self._full_seen
            full_in_s = 0.0
            if report.delta and missing_full:
                full_in_s = self._full_pacer.wait_s(node, received_at, len(self._awaiting_restored))
        return IngestAnswer(send_full=bool(report.delta) and (missing_full or snapshot_due), full_in_s=full_in_s)

    def ingest_summary(self, summary: Summary, received_at: float | None = None) -> SummaryAnswer:
        """Keep a summarising relay's summary of its nodes' giant jobs (monitor/engine/summaries.py).
        ValueError with the reason when it is refused; then nothing changed."""
        why = check_summary(summary, self.limits)
        if why is not None:
            raise ValueError(why)
        received_at = self.clock() if received_at is None else received_at
        with self._lock:
            answer, touched = self._summaries.take(summary, received_at, self._state)
            self._dirty |= touched & self._state.jobs.keys()
            # The ranks the job's answer names (its culprits) come whole from here on: a member of a group
            # carries no sockets, progress history or settings of its own, and those are their evidence.
            named = {job.job_id: sorted(result.diagnosis.culprit_ranks)[:DETAIL_RANKS_MAX] for job in summary.jobs
                     if (result := self._results.get(job.job_id)) is not None and result.diagnosis.culprit_ranks}
        return dataclasses.replace(answer, detail=named) if named else answer

    def _rank_count(self, job: JobTrack) -> int:
        """The job's ranks: those reported here, and those relays summarise."""
        return len(job.ranks) + self._summaries.rank_count(job.job_id)

    def _ingest_replayed(self, report: Any, received_at: float, attributed: bool = False) -> IngestAnswer:
        """Apply a report the agent kept through an outage at the time it was taken, and record
        the verdicts it leads to at that time: the job's history gets what happened meanwhile."""
        with self._lock:
            known = self._state.nodes.get(report.node)
            # The node's clock offset as its live reports showed it (none known: trust its clock).
            at = report.sent_at + (known.offset if known is not None else 0.0)
            at = min(at, received_at)
            if known is not None:
                at = max(at, known.last_report_at)  # never behind what is already applied
            if received_at - at > MAX_REPLAY_AGE_S:
                self.replayed_dropped += 1
                return IngestAnswer(send_full=False)
            touched = self._state.apply(report, at)
            self._state.nodes[report.node].attributed = attributed
            self.reports_total += 1
            self.replayed_total += 1
            jobs = sorted(j for j in touched if j in self._state.jobs)
            # A giant job is not judged at each replayed report: after a restart each of its nodes delivers
            # its own (1,250 at 10,000 ranks), at ~0.1 s a diagnosis on the event loop: minutes of it, the
            # posts timing out and sent again. Its nodes restored from the store are not the present, so
            # such a judgement reads "unknown" anyway; the next pass judges the job.
            giant = [j for j in jobs if self._rank_count(self._state.jobs[j]) > GIANT_JOB_RANKS]
            self._dirty.update(giant)
            jobs = [j for j in jobs if j not in giant]
            self._diagnose_jobs(jobs, at, live=False)
            # Those diagnoses are of the past: the next read judges these jobs again, at its own time.
            for job_id in jobs:
                self._results.pop(job_id, None)
        return IngestAnswer(send_full=False)

    def refusal(self, report: Any) -> Refusal | None:
        """Why the monitor must not take ``report`` in as things stand (monitor/ingest/limits.py); None
        when it may. It forgets nothing: ``make_room`` is the step that forgets to let it in."""
        with self._lock:
            state = self._state
            known = state.nodes.get(report.node)
            stale = stale_reason(report, known.last_taken() if known is not None else None, self.clock())
            if stale is not None:
                return Refusal(409, "stale", stale)
            return check_report(report, self.limits, state.jobs.keys(), state.nodes.keys(), state.resolve,
                                state.known_ranks, state.ranks_total, state.jobs_of_node)

    def make_room(self, report: Any, refusal: Refusal) -> Refusal | None:
        """Forget what ended or fell silent to take ``report`` past ``refusal`` (a limit, not a stale
        report): the nodes, jobs or ranks its limit counts. Returns what still refuses it, if anything."""
        if refusal.reason == "stale":
            return refusal
        with self._lock:
            state, limits, now = self._state, self.limits, self.clock()
            if refusal.reason == "too_many_nodes":
                state.make_room_for_node(report.node, limits.max_nodes, now, self.settings.job_retention_s)
                refusal = self.refusal(report)
            # Silence means nothing until the monitor has listened that long: after a restart every
            # job's last report is its snapshot's, and live jobs would make room for junk.
            if refusal is None or now - self.started_at <= limits.job_room_silent_s:
                return refusal
            silent_s = limits.job_room_silent_s
            for _ in range(3):  # room made for one limit may leave the report short of another's
                made: list[str] = []
                if refusal.reason == "node_jobs":
                    made = state.make_room_in_node(report.node, len(refusal.excess_jobs), now, silent_s)
                elif refusal.reason == "too_many_jobs":
                    made = state.make_room_for_jobs(refusal.new_jobs, limits.max_jobs, now, silent_s)
                elif refusal.reason == "too_many_ranks":
                    made = state.make_room_for_ranks(refusal.new_ranks, limits.max_ranks, now, silent_s)
                if not made:
                    break
                self.jobs_displaced += len(made)
                log.info("at %s: forgot %d jobs ended or silent for over %.0fs (%s) to take new ones",
                         _LIMIT_NAMES[refusal.reason], len(made), silent_s,
                         ", ".join(made[:5]) + (" ..." if len(made) > 5 else ""))
                refusal = self.refusal(report)
                if refusal is None:
                    break
            return refusal

    def without_jobs(self, report: Any, job_ids: frozenset[str]) -> Any:
        """``report`` without its entries of ``job_ids`` (the monitor's ids): a refused excess."""
        with self._lock:
            resolve = self._state.resolve
            return msgspec.structs.replace(
                report, ranks=[r for r in report.ranks if resolve(r.job_id) not in job_ids],
                launchers=[launcher for launcher in report.launchers
                           if not launcher.job_id or resolve(launcher.job_id) not in job_ids])

    def reject(self, reason: str) -> None:
        with self._lock:
            self._rejected[reason] = self._rejected.get(reason, 0) + 1

    def replay(self) -> int:
        """Rebuild state from the stored snapshots, oldest first; return how many were replayed."""
        since = self.clock() - self.store.snapshot_retention_s
        count = 0
        with self._lock:
            for stored in self.store.recent_snapshots(since):
                try:
                    report = decode_report(stored.body)
                except pydantic.ValidationError:
                    log.warning("skipping a stored report from %s that no longer validates", stored.node)
                    continue
                self._state.apply(report, stored.received_at)
                # Not the node's present, however recent, until its agent reports to this process: a job
                # is not judged from a picture restored from the store (monitor/ingest/tracks.is_fresh).
                self._state.nodes[report.node].partial = True
                self._snapshot_due[stored.node] = stored.received_at + self.settings.snapshot_interval_s * _spread(stored.node)
                self._awaiting_restored.add(stored.node)
                count += 1
            self._restored_nodes = len(self._awaiting_restored)
            for job_id, change in self.store.latest_verdicts().items():
                self._ledger.restore(job_id, (change.verdict, change.culprit_ranks))
                if change.verdict in ALARMS:
                    # A raised alarm stays raised across a restart: without this the first
                    # reading would publish "healthy" while it re-confirms, and alerts would
                    # resolve and fire again on every restart.
                    held = Diagnosis(change.verdict, change.culprit_ranks, change.at, change.summary)
                    self._settled[job_id] = Settled(held, held, alarm_since=change.at)
        return count

    # --- diagnosis ---

    def results(self, now: float | None = None, job_id: str | None = None) -> list[JobResult]:
        """The diagnosis of every known job (or one); most recently active job first."""
        now = self.clock() if now is None else now
        with self._lock:
            if self.settings.tick_interval_s <= 0:
                self._state.prune(now, self.settings.job_retention_s)
            if job_id is not None:
                job_id = self._state.resolve(job_id)  # another node's spelling of the id
            ids = [j for j in self._state.jobs if job_id is None or j == job_id]
            self._diagnose_jobs(self._due_for_read(ids, now), now)
            results = [self._results[j] for j in ids]
        results.sort(key=lambda r: (-r.last_report_at, r.view.job_id))
        return results

    def _due_for_read(self, ids: list[str], now: float) -> list[str]:
        if self.settings.tick_interval_s <= 0:
            return ids
        missing = [j for j in ids if j not in self._results]
        changed = [j for j in ids if j in self._dirty and j in self._results and self._needs_diagnosis(j, now)]
        if sum(self._rank_count(self._state.jobs[j]) for j in changed) <= self.settings.fresh_read_ranks:
            return missing + changed
        return missing

    def _needs_diagnosis(self, job_id: str, now: float) -> bool:
        """False for a healthy job that is visibly advancing and whose lifecycle did not change."""
        result = self._results.get(job_id)
        if result is None or result.diagnosis.verdict != "healthy" or now - result.view.now >= REFRESH_S:
            return True
        job = self._state.jobs[job_id]
        if self._revisions.get(job_id) != job.lifecycle_revision or self._held_clock_due(job, now):
            return True
        settled = self._settled.get(job_id)
        if settled is not None and settled.pending is not None:
            return True  # an alarm under confirmation needs its next reading now, not in REFRESH_S
        progressed = job.last_progress_at
        return progressed is None or now - progressed > ADVANCING_S

    @staticmethod
    def _held_clock_due(job: JobTrack, now: float) -> bool:
        """A rank of the job has been held long enough that the ranks' own clock may call a stall now
        (diagnosis.held), however the log advances: the job is diagnosed at this pass, not REFRESH_S on.
        Walks the held ranks only (none in a job that trains)."""
        for r in job.held_ranks:
            track = job.ranks.get(r)
            since = held_since(track) if track is not None else None
            if since is not None and now - since >= HELD_MIN_S - HELD_LEAD_S:
                return True
        return False

    def forget_stale(self, now: float) -> list[str]:
        """Forget what ended or fell silent past the job retention, and everything kept per job and
        per node with it; the ids of the jobs left. Each pass starts with it; a summarising relay,
        which runs no passes, calls it before each summary."""
        with self._lock:
            return self._forget_stale(now)

    def _forget_stale(self, now: float) -> list[str]:
        self._state.prune(now, self.settings.job_retention_s)
        # Silence means nothing until the monitor has listened that long (see ``refusal``).
        if now - self.started_at > self.limits.job_room_silent_s:
            self._silent_budget.enforce(self._state, now, self.limits.job_room_silent_s)
        known = set(self._state.jobs)
        # What the monitor keeps per job goes with the job.
        for per_job in (self._results, self._revisions, self._settled):
            for gone in set(per_job) - known:
                del per_job[gone]
        self._ledger.keep_only(known, now)
        if self.actions is not None:
            self.actions.keep_only(known)
        if self.captures is not None:
            self.captures.keep_only(known)
        self.orders.expire(now)
        self._timeline.forget(self._state.jobs)
        self._dirty &= known
        self._dirty |= self._summaries.forget(now, known) & known
        # A node silent past the job retention (its jobs forgotten) starts over with a full report.
        self._full_seen &= {n for n, t in self._state.nodes.items() if now - t.last_report_at <= self.settings.job_retention_s}
        for gone in self._snapshot_due.keys() - self._state.nodes.keys():
            del self._snapshot_due[gone]  # else every node name ever heard stays here
        return list(self._state.jobs)

    def tick(self, now: float | None = None) -> None:
        """One diagnosis pass over every job, so verdict changes are recorded even while nobody asks."""
        for step in self.tick_steps(now):
            if step is not None:
                step.run()

    def tick_steps(self, now: float | None = None, step_s: float = 0.002) -> Iterator[Offload | None]:
        """``tick`` in steps of about ``step_s`` of work (at least one job each): the event
        loop serves requests between them, each of which waits for at most one step per await.
        A step may be an ``Offload``: pure work the caller runs (on a worker thread) before going on."""
        now = self.clock() if now is None else now
        started = time.perf_counter()
        with self._lock:
            ids = self._forget_stale(now)
        step_started = time.perf_counter()
        for job_id in ids:
            with self._lock:
                job = self._state.jobs.get(job_id)
                if job is None or not self._needs_diagnosis(job_id, now):
                    continue
                giant = self._rank_count(job) > GIANT_JOB_RANKS
                if not giant:
                    self._diagnose_jobs([job_id], now)
            if giant:
                yield from self._giant_job_steps(job, now, step_s)
                step_started = time.perf_counter()
            elif time.perf_counter() - step_started >= step_s:
                yield None
                step_started = time.perf_counter()
        self.last_pass_at = now
        self.last_pass_s = time.perf_counter() - started

    def _giant_job_steps(self, job: JobTrack, now: float, step_s: float) -> Iterator[Offload | None]:
        """A giant job's diagnosis in steps. Its rank views are taken a chunk at a time, requests
        served in between, and read as they were taken (a pass is a picture of about a second:
        taking them all again at the end would redo most, as every rank reports each second). Its
        rules then run as an ``Offload`` (on a worker thread, outside the lock) over the immutable
        view, instead of holding the event loop ~0.1 s for 10,000 ranks; the result is stored under
        the lock as it comes back."""
        job_id = job.job_id
        with self._lock:
            rank_ids = sorted(job.ranks)
            # Taken before the views: a change that lands while they are taken moves it, so the
            # next pass looks again.
            revision = job.lifecycle_revision
        views: list[RankView] = []
        step_started = time.perf_counter()
        for start in range(0, len(rank_ids), VIEW_CHUNK):
            with self._lock:
                if self._state.jobs.get(job_id) is not job:
                    return  # forgotten, or a new run under the id: its own pass comes
                tracks = job.ranks
                views.extend(rank_view(tracks[r]) for r in rank_ids[start:start + VIEW_CHUNK] if r in tracks)
            if time.perf_counter() - step_started >= step_s:
                yield None
                step_started = time.perf_counter()
        with self._lock:
            if self._state.jobs.get(job_id) is not job:
                return
            if len(job.ranks) != len(views):  # a rank joined meanwhile: take them all now
                views = [rank_view(job.ranks[r]) for r in sorted(job.ranks)]
            view = job_view(job, self._state.nodes, now, self.started_at, tuple(views), self._state.cpu_level_window_s)
            # Summarising relays' shares, merged with the rules' run (pure work: outside the lock).
            shares = self._summaries.book.shares(job_id)
            hosts = self._summaries.book.hosts(shares) if shares else {}
            # Reports from here on are news to the next pass, not covered by this one.
            self._dirty.discard(job_id)
        found: list[tuple[JobView, Diagnosis]] = []

        def judge() -> None:
            merged = merged_view(view, shares, hosts)
            found.append((merged, self._run_diagnosis(merged)))

        yield Offload(judge)
        with self._lock:
            if not found or self._state.jobs.get(job_id) is not job:
                return
            self._store(job, found[0][0], found[0][1], revision, now, clear_dirty=False)
            result = self._results[job_id]
        follow_up = self.after_giant_diagnosis
        # Asked here, as the result is published (a read may come before a worker thread starts).
        work = follow_up(result) if follow_up is not None else None
        if work is not None:
            yield Offload(work)

    def _diagnose_jobs(self, ids: Iterable[str], now: float, live: bool = True) -> None:
        for job_id in ids:
            job = self._state.jobs[job_id]
            view = job_view(job, self._state.nodes, now, self.started_at,
                            cpu_level_window_s=self._state.cpu_level_window_s)
            shares = self._summaries.book.shares(job_id)
            if shares:
                view = merged_view(view, shares, self._summaries.book.hosts(shares))
            self._store(job, view, self._run_diagnosis(view), job.lifecycle_revision, now, live=live)

    def _store(self, job: JobTrack, view: JobView, found: Diagnosis, revision: int, now: float,
               clear_dirty: bool = True, live: bool = True) -> None:
        """Keep a job's new diagnosis: its timeline, the published (settled) verdict, its history.
        ``clear_dirty``: no report came since ``view`` was taken (else the job stays due for reads).
        ``live``: judged at the present (not a report replayed after an outage): actions may follow."""
        job_id = job.job_id
        # Each rank's state as observed, whatever verdict is published while an alarm confirms.
        self._timeline.record(job_id, now, ((r.rank, r.state) for r in found.ranks),
                             healthy=found.verdict == "healthy")
        if self.settings.confirm_alarms:
            settled = self._settled[job_id] = settle(self._settled.get(job_id), found, now, job.last_progress_at,
                                                     live=live)
            found = settled.shown
        culprit_nodes = _culprit_nodes(view, found.culprit_ranks)
        cost = self._ledger.account(job_id, view, found, culprit_nodes, now)
        result = JobResult(
            view=view,
            diagnosis=found,
            last_report_at=job.last_report_at,
            last_progress_at=job.last_progress_at,
            cpu_seconds={r: t.latest.cpu_seconds for r, t in job.ranks.items()},
            lost_rank_seconds=dict(cost.rank_seconds),
            lost_gpu_seconds=dict(cost.gpu_seconds),
            aliases=tuple(sorted(job.aliases)),
            job_progress_points=tuple(job.progress_points),
            rank_conflicts=tuple(RankConflict(c.rank, c.claimed_by, c.held_by, c.first_at, c.last_at, c.refused, c.reason)
                                 for c in sorted(job.claim_conflicts.values(), key=lambda c: c.rank)),
        )
        self._results[job_id] = result
        self._revisions[job_id] = revision
        if clear_dirty:
            self._dirty.discard(job_id)
        self._ledger.record(job_id, found, now, culprit_nodes, live)
        if not live:
            return
        actions = self.actions
        if actions is not None and found.verdict in actions.verdicts:
            actions.observe(self._facts(job, found, now), now)
        elif actions is not None and found.verdict in ENDS_INCIDENT:
            # It only ends an incident: no culprits or nodes to gather (O(ranks) for a giant job).
            actions.observe(JobFacts(job.job_id, found.verdict, found.summary), now)
        if self.captures is not None:
            self.captures.observe(job, found.verdict, found.culprit_ranks, now)

    def _facts(self, job: JobTrack, found: Diagnosis, now: float) -> JobFacts:
        """What an action needs of a published verdict (monitor/engine/actions/policy.py)."""
        culprits = []
        reported_pids = ReportedPids(self._state.nodes, self._state.jobs)
        for rank in found.culprit_ranks:
            track = job.ranks.get(rank)
            if track is not None:
                pid = track.pid if track.alive else None
                culprits.append(Culprit(rank, track.node, pid, track.latest.started_at, track.latest.job_id,
                                        reported_pids.conflict(track.node, job.job_id, rank, pid)))
        unattributed = why_unattributed(job, found.culprit_ranks, self._state.nodes, now)
        if unattributed is None and self._summaries.rank_count(job.job_id):
            # A summary speaks for thousands of ranks from one relay: no action acts on what it says.
            unattributed = "ranks of the job come from summarising relays, not from their own nodes' reports"
        return JobFacts(job.job_id, found.verdict, found.summary, tuple(culprits), self._results[job.job_id].names,
                        unattributed)

    def _run_diagnosis(self, view: JobView) -> Diagnosis:
        diagnose = self._diagnose or diagnosis.diagnose
        try:
            return diagnose(view)
        except Exception:
            # One job tripping a rule must not blank the page or the scrape for every job.
            log.exception("diagnosis failed for job %r", view.job_id)
            return Diagnosis("stalled", (), None, "diagnosis failed inside the monitor (see its log)")

    def history(self, job_id: str) -> list[VerdictChange]:
        with self._lock:
            job_id = self._state.resolve(job_id)
        return self.store.verdict_history(job_id)

    def suspect_nodes(self, window_s: float) -> list[SuspectNode]:
        """Nodes named as culprits in incidents within the last ``window_s``, most distinct jobs
        first (monitor/engine/incidents.py). A database read: call it off the event loop."""
        since = self.clock() - window_s
        return suspect_nodes(incidents(self.store.changes_since(since)), since)

    def cached_suspect_nodes(self) -> list[SuspectNode]:
        """``suspect_nodes`` over ``suspect_window_s``, read again at most every SUSPECTS_REFRESH_S
        (for /metrics: a scrape every 15 s need not read a month of history each time)."""
        now = self.clock()
        cached = self._suspects
        if cached is None or now - cached[0] >= SUSPECTS_REFRESH_S:
            cached = self._suspects = (now, self.suspect_nodes(self.settings.suspect_window_s))
        return cached[1]

    def resolve(self, job_id: str) -> str:
        """The monitor's id for ``job_id``, which may be another node's spelling of it."""
        with self._lock:
            return self._state.resolve(job_id)

    def job_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._state.jobs)

    def node_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._state.nodes)

    def rank_timeline(self, job_id: str, now: float, first: Iterable[int] = (),
                      limit: int | None = None) -> TimelineSpans:
        """The states of at most ``limit`` of the job's ranks over the timeline's window: ``first``
        (the culprits) and then the lowest ranks; every rank without ``limit``. The runs are copied
        under the lock and clipped outside it: at 10,000 ranks the spans take a while to make."""
        with self._lock:
            kept = self._timeline.ranks(job_id)
            chosen: list[int] | None = None
            if limit is not None:
                known = set(kept)
                leading = [r for r in first if r in known]
                lead = set(leading)
                chosen = (leading + [r for r in kept if r not in lead])[:limit]
            runs = self._timeline.runs(job_id, chosen)
        return TimelineSpans(now, self._timeline.window_s, len(kept), self._timeline.clipped(runs, now))

    def owes_full(self, node: str) -> bool:
        """Whether ``node``'s next report this process needs is a full one (after a restart, every
        node's until it sends it). Its posts are never shed (monitor/web/routes/ingest.py): a job is
        ``unknown`` until its last node's full report, and a node shed once is shed again after its
        Retry-After while the loop stays behind (a 10,000-rank job's verdict waited 20-30 s on them)."""
        with self._lock:
            return node not in self._full_seen

    def answer_owed_delta(self, report: Any, received_at: float | None = None) -> IngestAnswer | None:
        """The answer to a delta from a node that owes its full report, without applying it (the
        monitor is behind: a delta on a picture it does not hold changes nothing it can judge, and
        costs as much to apply as any); None when ``report`` is not one, to be taken as usual."""
        if not report.delta or report.replayed:
            return None
        received_at = self.clock() if received_at is None else received_at
        with self._lock:
            # A node this process never heard of is taken as usual, through the limits (``refusal``).
            if report.node in self._full_seen or report.node not in self._state.nodes:
                return None
            self.deltas_deferred += 1
            wait = self._full_pacer.wait_s(report.node, received_at, len(self._awaiting_restored))
        return IngestAnswer(send_full=True, full_in_s=wait)

    def _rebuild_progress(self, now: float | None = None) -> RebuildProgress | None:
        """How far the rebuild after a restart is; None once every restored node sent a full report, or
        ``job_room_silent_s`` after the start (the time silence means nothing after a restart, ``refusal``)."""
        now = self.clock() if now is None else now
        with self._lock:
            if not self._awaiting_restored:
                return None
            left = self.started_at + self.limits.job_room_silent_s - now
            if left <= 0:
                self._awaiting_restored.clear()  # a node that never came back holds nothing up
                return None
            return RebuildProgress(self._restored_nodes, len(self._awaiting_restored), left)

    def readiness(self) -> Readiness:
        """Whether the monitor is ready for traffic, and if not why (monitor/engine/readiness.py): read for
        /readyz, /metrics and systemd's status. Two statvfs calls and a few lookups."""
        volumes = [self.store.volume()]
        if self.captures is not None:
            volumes.append(self.captures.store.volume())
        health = self.store.health
        return decide(None if health.ok else (health.problem or "failing"), [v for v in volumes if v is not None],
                      self._overloaded is not None and self._overloaded(), self._rebuild_progress())

    def status(self) -> MonitorStatus:
        with self._lock:
            return MonitorStatus(self.clock(), len(self._state.nodes), len(self._state.jobs), self.last_pass_at,
                                 self.last_pass_s, self.store.health.problem)

    def figures(self) -> MonitorFigures:
        """The monitor's own counters, copied at one moment (/metrics renders them on a worker thread)."""
        readiness = self.readiness()  # before the lock: it reads the volumes
        with self._lock:
            state, actions = self._state, self.actions
            return MonitorFigures(
                at=self.clock(),
                nodes=len(state.nodes),
                jobs=len(state.jobs),
                ranks=sum(self._rank_count(j) for j in state.jobs.values()),
                reports_total=self.reports_total,
                full_reports_total=self.full_reports_total,
                deltas_deferred=self.deltas_deferred,
                replayed_total=self.replayed_total,
                replayed_dropped=self.replayed_dropped,
                jobs_displaced=self.jobs_displaced,
                claims_refused=state.claims_refused,
                last_pass_at=self.last_pass_at,
                last_pass_s=self.last_pass_s,
                rejected=tuple(sorted(self._rejected.items())),
                node_incidents=tuple(sorted(self._ledger.node_incidents.items())),
                node_lost_gpu_seconds=tuple(sorted(self._ledger.node_lost_gpu_seconds.items())),
                node_summaries=tuple(node_summaries(state.nodes)),
                store=self.store.figures(),
                action_counts=None if actions is None else tuple(sorted(dict(actions.counts).items())),
                captures=capture_figures(self.captures),
                readiness=readiness,
                summaries_total=self._summaries.taken,
                summarising_relays=tuple(self._summaries.book.relays()),
            )

    def knows_job(self, job_id: str) -> bool:
        with self._lock:
            return self._state.resolve(job_id) in self._state.jobs

    def nodes(self) -> list[NodeSummary]:
        with self._lock:
            return node_summaries(self._state.nodes)


def _culprit_nodes(view: JobView, culprit_ranks: Iterable[int]) -> tuple[str, ...]:
    """The nodes the culprit ranks run on, sorted; none without culprits (no walk over the ranks)."""
    culprits = set(culprit_ranks)
    if not culprits:
        return ()
    return tuple(sorted({r.node for r in view.ranks if r.rank in culprits}))


def _spread(node: str) -> float:
    """A factor in [0.8, 1.2) fixed per node, so snapshots of 1,000 nodes do not all fall due together."""
    return 0.8 + 0.4 * (zlib.crc32(node.encode()) % 1000) / 1000
