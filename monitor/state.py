"""What the monitor knows about each job, rank and node, kept up to date report by report.

Every time is put on the monitor's clock as it comes in: the agent's clock is
shifted by ``received_at - sent_at`` of the report that carried it.
``monitor.views`` turns this into the diagnosis's ``JobView``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from monitor.diagnosis import ExitView, Frame, LogPhase, Stack, stacks
from monitor.diagnosis.activity import MOVING_BYTES_PER_S
from monitor.diagnosis.model import FlightRecord
from monitor.diagnosis.phases import phase_of
from monitor.flight_recorder_views import flight_record
from monitor.wire import (
    AgentInfo,
    CollectorHealth,
    ExitReport,
    FlightRecorderReport,
    HostReport,
    LauncherReport,
    NcclRasReport,
    OrphanReport,
    ProgressReport,
    RankReport,
    Report,
    SocketReport,
    StackReport,
)

# Below this CPU percent a rank counts as idle (waiting, not computing).
IDLE_CPU_PERCENT = 10.0
PROGRESS_HISTORY = 64
# Recent (monitor time, step) points per rank and per job, for the page's progress chart.
PROGRESS_POINTS_KEPT = 120
LOG_ERRORS_KEPT = 50
KNOWN_SITES_KEPT = 64
# Phase marks per job: one per phase episode is enough to tell what a silent stretch was.
PHASE_MARKS_KEPT = 64
# How long a forgotten job's dead ranks are ignored (agents stop listing them well before).
FORGOTTEN_KEPT_S = 24 * 3600.0
# How long a silent node is remembered (its jobs go after the job retention): while it is, its
# last report time stays on /metrics and the agent-silent alert holds instead of clearing itself.
SILENT_NODE_KEPT_S = 24 * 3600.0
# Stack samples kept per rank for the collective wait share, and over how long.
WAIT_SAMPLES_KEPT = 1024
WAIT_SHARE_WINDOW_S = 600.0
WAIT_SHARE_MIN_SAMPLES = 5

RankKey = tuple[str, int]
# A launcher on one node: (job_id, pid).
LauncherKey = tuple[str, int]
SocketKey = tuple[str, str, str]  # (local, remote, state)


@dataclass
class ProgressCursor:
    """How far one progress source has been read: its event count and newest time taken.

    The mark is on the agent's clock: dedupe on the agent's own numbers, since the
    shift onto the monitor's clock jitters with network latency.
    """

    events: int | None = None
    mark: float | None = None


@dataclass
class RankTrack:
    job_id: str
    rank: int
    node: str
    pid: int
    first_seen_at: float
    observed_at: float
    latest: RankReport
    alive: bool = True
    exit: ExitView | None = None
    # True when the agent stopped listing this rank without saying it ended.
    vanished: bool = False
    proc_state: str | None = None
    state_since: float | None = None
    idle_since: float | None = None
    # The last report in which the rank moved data (writes, sends) at MOVING_BYTES_PER_S or more.
    moved_at: float | None = None
    progress_cursor: ProgressCursor = field(default_factory=lambda: ProgressCursor())
    progress_times: deque[float] = field(default_factory=lambda: deque(maxlen=PROGRESS_HISTORY))
    # (time on the monitor's clock, step), oldest first: from progress lines that print a step.
    progress_points: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=PROGRESS_POINTS_KEPT))
    last_progress_at: float | None = None
    stack: Stack | None = None
    # Wait site of ``stack`` not yet known to be a regular sync point of the job.
    pending_wait_site: str | None = None
    log_errors: list[str] = field(default_factory=list)
    # When (monitor clock) each socket currently reported was first seen in its state.
    sockets_since: dict[SocketKey, float] = field(default_factory=dict)
    # One (taken_at on the monitor's clock, waiting in a collective) per distinct stack.
    wait_samples: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=WAIT_SAMPLES_KEPT))
    # taken_at of the last stack sampled, on the agent's clock (the agent re-sends its latest stack).
    last_stack_mark: float | None = None
    # Facts the agent may send once (or only once found): the last one reported is kept.
    env: dict[str, str] = field(default_factory=dict)
    error_file_message: str | None = None
    compute_dtype: str | None = None
    compute_dtype_line: str | None = None
    log_phase: LogPhase | None = None
    log_phase_mark: float | None = None  # its seen_at on the agent's clock
    # The latest Flight Recorder dump the agent read, and the report it came in.
    flight_recorder: FlightRecord | None = None
    flight_recorder_report: FlightRecorderReport | None = None

    def wait_share(self, now: float) -> float | None:
        """Share of the recent stack samples that waited in a collective; None below the minimum count."""
        recent = [waiting for at, waiting in self.wait_samples if at >= now - WAIT_SHARE_WINDOW_S]
        if len(recent) < WAIT_SHARE_MIN_SAMPLES:
            return None
        return sum(recent) / len(recent)


@dataclass
class LauncherTrack:
    job_id: str
    node: str
    pid: int
    first_seen_at: float
    observed_at: float
    latest: LauncherReport
    alive: bool = True
    exit: ExitView | None = None
    vanished: bool = False
    stack: Stack | None = None
    sockets_since: dict[SocketKey, float] = field(default_factory=dict)
    log_errors: list[str] = field(default_factory=list)


@dataclass
class JobTrack:
    job_id: str
    ranks: dict[int, RankTrack] = field(default_factory=dict)
    # Launchers of this job, by (node, pid).
    launchers: dict[tuple[str, int], LauncherTrack] = field(default_factory=dict)
    # The world size the ranks report (the latest one); None until a rank reported.
    reported_world_size: int | None = None
    last_report_at: float = 0.0
    progress_times: deque[float] = field(default_factory=lambda: deque(maxlen=PROGRESS_HISTORY))
    # (time, step) points from job-scope logs, like ``RankTrack.progress_points``.
    progress_points: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=PROGRESS_POINTS_KEPT))
    # One cursor per (node, log source): ranks sharing one log all report the same
    # lines, and this keeps each line once.
    progress_cursors: dict[tuple[str, str], ProgressCursor] = field(default_factory=dict)
    job_step: int | None = None
    job_step_at: float | None = None
    known_wait_sites: set[str] = field(default_factory=set)
    # (node, pid) of the ranks and launchers of the run that used this id before: their
    # ended entries, still listed by agents, are not this run's.
    previous_run_pids: frozenset[tuple[str, int]] = frozenset()
    # Other ids its ranks or launchers reported (see MonitorState._canonical_job_id).
    aliases: set[str] = field(default_factory=set)
    # (monitor time, phase): see JobView.phase_marks.
    phase_marks: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=PHASE_MARKS_KEPT))
    # Counts changes that can turn a verdict at once: a rank or launcher appearing, ending,
    # vanishing or changing process state, the world size, a launcher's errors. The monitor
    # re-diagnoses a healthy, advancing job right away only when this moved (service.py).
    lifecycle_revision: int = 0

    def mark_phase(self, at: float, phase: str) -> None:
        """Note the job in ``phase`` at ``at``; repeats within one silent stretch add nothing."""
        last = self.phase_marks[-1] if self.phase_marks else None
        progressed = self.last_progress_at
        if last and last[1] == phase and (progressed is None or last[0] > progressed) and at >= last[0]:
            return
        self.phase_marks.append((at, phase))
        if last and at < last[0]:  # a late report: keep time order
            self.phase_marks = deque(sorted(self.phase_marks), maxlen=PHASE_MARKS_KEPT)

    @property
    def world_size(self) -> int:
        """What the ranks say; else nnodes x nproc_per_node from a launcher; else 1."""
        if self.reported_world_size is not None:
            return self.reported_world_size
        derived = [launcher_world_size(t.latest) for t in self.launchers.values()]
        return max((w for w in derived if w is not None), default=1)

    @property
    def first_seen_at(self) -> float:
        seen = [r.first_seen_at for r in self.ranks.values()]
        seen += [t.first_seen_at for t in self.launchers.values()]
        return min(seen, default=self.last_report_at)

    @property
    def nodes(self) -> set[str]:
        """The nodes the job runs on: its ranks' and its launchers' nodes."""
        return {t.node for t in self.ranks.values()} | {t.node for t in self.launchers.values()}

    @property
    def last_progress_at(self) -> float | None:
        times = [r.last_progress_at for r in self.ranks.values() if r.last_progress_at is not None]
        if self.progress_times:
            times.append(self.progress_times[-1])
        return max(times, default=None)

    @property
    def ended_at(self) -> float | None:
        """When the last rank (or launcher) ended, if every one has; None while one is alive."""
        tracks: list[RankTrack | LauncherTrack] = [*self.ranks.values(), *self.launchers.values()]
        if not tracks or any(t.alive for t in tracks):
            return None
        return max((t.exit.at if t.exit else t.observed_at) for t in tracks)


@dataclass(frozen=True)
class NcclRasTrack:
    """A node's latest answer from NCCL's RAS service, its times on the monitor's clock."""

    polled_at: float
    unchanged_since: float
    answer: NcclRasReport


@dataclass
class NodeTrack:
    node: str
    last_report_at: float
    offset: float
    agent: AgentInfo
    host: HostReport
    collectors: tuple[CollectorHealth, ...]
    rank_keys: set[RankKey] = field(default_factory=set)
    launcher_keys: set[LauncherKey] = field(default_factory=set)
    orphans: tuple[OrphanReport, ...] = ()
    nccl_ras: NcclRasTrack | None = None
    # Running totals over this monitor's life, for the agent-health counters.
    collector_errors: dict[str, int] = field(default_factory=dict)
    stack_failures: int = 0


# ``wait_site(stack, cpu_percent)``: the collective call site a stack waits in, if any.
WaitSite = Callable[[Stack, float | None], str | None]


class MonitorState:
    def __init__(self) -> None:
        self.jobs: dict[str, JobTrack] = {}
        self.nodes: dict[str, NodeTrack] = {}
        # Ended jobs already forgotten, and when: an agent may go on listing their dead
        # ranks for a while, which must not bring the job back. A live rank does.
        self.forgotten: dict[str, float] = {}
        # Job ids that name a known job's rendezvous another way (a host name on one node,
        # its address on another): alias -> the id the job was first seen under.
        self.aliases: dict[str, str] = {}
        # (node, pid) of forgotten jobs' processes, by id: a new run under the id skips them.
        self.forgotten_pids: dict[str, frozenset[tuple[str, int]]] = {}

    def apply(self, report: Report, received_at: float, wait_site: WaitSite = stacks.wait_site) -> set[str]:
        """Take in one accepted report; return the ids of the jobs it touched."""
        offset = received_at - report.sent_at
        node = self.nodes.get(report.node)
        previous_keys = node.rank_keys if node else set()
        previous_launchers = node.launcher_keys if node else set()
        node = NodeTrack(
            node=report.node,
            last_report_at=received_at,
            offset=offset,
            agent=report.agent,
            host=report.host or (node.host if node else HostReport()),
            collectors=tuple(report.collectors),
            orphans=tuple(report.orphans),
            nccl_ras=_nccl_ras(report, node, offset),
            collector_errors=dict(node.collector_errors) if node else {},
            stack_failures=(node.stack_failures if node else 0) + sum(1 for r in report.ranks if r.stack_error),
        )
        for health in report.collectors:
            if not health.ok:
                node.collector_errors[health.name] = node.collector_errors.get(health.name, 0) + 1
        self.nodes[report.node] = node
        touched: set[str] = set()
        # An agent lists an ended process for minutes after it ended: once its rank runs
        # again under a new pid (a launcher restart), the old entry is history, not news.
        ids = {r.job_id: self._canonical_job_id(r.job_id) for r in report.ranks}
        live_ranks = {(ids[r.job_id], r.rank) for r in report.ranks if r.alive}
        for rank_report in report.ranks:
            job_id = ids[rank_report.job_id]
            if not rank_report.alive and (
                job_id in self.forgotten or rank_report.job_id in self.forgotten or (job_id, rank_report.rank) in live_ranks
            ):
                continue
            self.forgotten.pop(job_id, None)
            job = self._job_for(job_id, report.node, rank_report.pid, rank_report.alive)
            if not rank_report.alive and self._is_history(job, report.node, rank_report):
                continue
            self._apply_rank(job, report.node, rank_report, received_at, offset, wait_site)
            node.rank_keys.add((job_id, rank_report.rank))
            touched.add(job.job_id)
        for job_id, rank in previous_keys - node.rank_keys:
            job = self.jobs.get(job_id)
            track = job.ranks.get(rank) if job else None
            if job and track and track.node == report.node and track.alive:
                _mark_vanished(track)
                job.lifecycle_revision += 1
                touched.add(job_id)
        for launcher_report in report.launchers:
            job_id = (
                (self._canonical_job_id(launcher_report.job_id) if launcher_report.job_id else None)
                or self._job_of_workers(report.node, launcher_report.worker_pids)
                # Its workers gone, a launcher that names no job stays with the job it had.
                or next((j for j, pid in previous_launchers if pid == launcher_report.pid), None)
            )
            if not job_id or (not launcher_report.alive and job_id in self.forgotten):
                continue
            self.forgotten.pop(job_id, None)
            job = self._job_for(job_id, report.node, launcher_report.pid, launcher_report.alive)
            if not launcher_report.alive and (report.node, launcher_report.pid) in job.previous_run_pids:
                continue
            self._apply_launcher(job, report.node, launcher_report, received_at, offset)
            node.launcher_keys.add((job_id, launcher_report.pid))
            touched.add(job_id)
        for job_id, pid in previous_launchers - node.launcher_keys:
            job = self.jobs.get(job_id)
            launcher = job.launchers.get((report.node, pid)) if job else None
            if job and launcher and launcher.alive:
                _mark_vanished(launcher)
                job.lifecycle_revision += 1
                touched.add(job_id)
        for job_id in touched:
            self._learn_wait_sites(self.jobs[job_id])
        return touched

    @staticmethod
    def _is_history(job: JobTrack, node: str, rr: RankReport) -> bool:
        """An ended process that no longer is the rank: the last run's, or one its launcher
        replaced (on this node or, after an elastic restart, on another)."""
        if (node, rr.pid) in job.previous_run_pids:
            return True
        current = job.ranks.get(rr.rank)
        return current is not None and current.alive and (current.node, current.pid) != (node, rr.pid)

    def resolve(self, job_id: str) -> str:
        """The id the monitor keeps a job under, given any id its nodes reported."""
        return self.aliases.get(job_id, job_id)

    def _canonical_job_id(self, job_id: str) -> str:
        """``job_id``, or the known job whose rendezvous it names another way.

        Nodes may spell MASTER_ADDR differently ("node0" on one, 10.0.0.1 on another): two
        "host:port" ids are one job when the ports match and both hosts name the same
        reporting node (its name, host name or an interface address). Loopback addresses
        name every node, so they never join anything.
        """
        if job_id in self.jobs or job_id in self.aliases:
            return self.resolve(job_id)
        parsed = _host_port(job_id)
        node = self._node_named(parsed[0]) if parsed else None
        if parsed is None or node is None:
            return job_id
        for other in self.jobs:
            theirs = _host_port(other)
            if theirs and theirs[1] == parsed[1] and theirs[0] != parsed[0] and self._node_named(theirs[0]) == node:
                self.aliases[job_id] = other
                self.jobs[other].aliases.add(job_id)
                return other
        return job_id

    def _node_named(self, host: str) -> str | None:
        host = host.strip("[]").lower()
        if host in ("localhost", "::1", "ip6-localhost") or host.startswith("127."):
            return None
        found = set()
        for n in self.nodes.values():
            names = {name for name in (n.node.lower(), n.host.hostname.lower()) if name}
            # "node0" names "node0.cluster" (and the reverse) when only one side is a full
            # name; two full names must match whole.
            short = {name.split(".", 1)[0] for name in names}
            full_known = any("." in name for name in names)
            if "." not in host:
                matched = host in short
            else:
                matched = host in names or (not full_known and not host[:1].isdecimal()
                                            and host.split(".", 1)[0] in names)
            if matched:
                found.add(n.node)
            elif any(a.split("/", 1)[0].lower() == host for i in n.host.interfaces for a in i.addresses):
                found.add(n.node)
        # An address several nodes have (docker0's 172.17.0.1) names none of them.
        return found.pop() if len(found) == 1 else None

    def _job_for(self, job_id: str, node: str, pid: int, alive: bool) -> JobTrack:
        """The job a report entry belongs to. A new live process under the id of a job whose
        every rank and launcher ended is a new run reusing the id (the same MASTER_PORT):
        it starts clean instead of inheriting the last run's steps, exits and pace. (A
        process the job already had, listed again after it was missed, is not new.)"""
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = JobTrack(job_id, previous_run_pids=self.forgotten_pids.get(job_id, frozenset()))
        elif alive and job.ended_at is not None:
            old = {(t.node, t.pid) for t in (*job.ranks.values(), *job.launchers.values())}
            if (node, pid) not in old:
                job = self.jobs[job_id] = JobTrack(job_id, previous_run_pids=frozenset(old), aliases=job.aliases)
        return job

    def _apply_rank(
        self,
        job: JobTrack,
        node: str,
        rr: RankReport,
        received_at: float,
        offset: float,
        wait_site: WaitSite,
    ) -> None:
        job.last_report_at = max(job.last_report_at, received_at)
        if job.reported_world_size != rr.world_size:
            job.reported_world_size = rr.world_size
            job.lifecycle_revision += 1
        track = job.ranks.get(rr.rank)
        if track is None or track.pid != rr.pid:
            # A new process for this rank (first sight, or restarted by its launcher):
            # per-process facts start over, the rank's progress history carries on.
            fresh = RankTrack(
                job_id=job.job_id,
                rank=rr.rank,
                node=node,
                pid=rr.pid,
                first_seen_at=received_at,
                observed_at=received_at,
                latest=rr,
            )
            if track is not None:
                fresh.progress_times = track.progress_times
                fresh.progress_points = track.progress_points
                fresh.progress_cursor = track.progress_cursor
                fresh.last_progress_at = track.last_progress_at
                fresh.first_seen_at = track.first_seen_at
            previous_observed = None
            track = job.ranks[rr.rank] = fresh
            job.lifecycle_revision += 1
        else:
            previous_observed = track.observed_at
        track.node = node
        track.latest = rr
        track.observed_at = received_at
        track.vanished = False

        if rr.state != track.proc_state:
            track.proc_state = rr.state
            job.lifecycle_revision += 1
            track.state_since = received_at
        moving = (rr.write_bytes_per_s or 0.0) >= MOVING_BYTES_PER_S
        if moving:
            track.moved_at = received_at
        if rr.cpu_percent is not None:
            # Idle is neither computing nor moving data: a rank sending over a slow link or
            # writing a checkpoint at low CPU is at work.
            if rr.cpu_percent < IDLE_CPU_PERCENT and not moving:
                if track.idle_since is None:
                    # cpu_percent is measured over the interval since the agent's previous
                    # sample, so the rank has been idle since about that report.
                    track.idle_since = previous_observed if previous_observed is not None else received_at
            else:
                track.idle_since = None

        track.log_errors = _merge_lines(track.log_errors, rr.log_errors, LOG_ERRORS_KEPT)
        if track.alive != rr.alive:
            job.lifecycle_revision += 1
        track.alive = rr.alive
        track.exit = None if rr.alive else _exit_view(track.exit, rr.exit, track.log_errors, received_at, offset)

        # The agent re-sends its latest stack with every report: only a new one is converted,
        # classified and sampled (ingest is the monitor's hot path).
        if rr.stack is not None and (track.last_stack_mark is None or rr.stack.taken_at > track.last_stack_mark):
            track.last_stack_mark = rr.stack.taken_at
            track.stack = to_stack(rr.stack, offset)
            phase = phase_of(track.stack)
            if phase is not None:
                job.mark_phase(track.stack.taken_at, phase)
            site = wait_site(track.stack, rr.cpu_percent)
            track.pending_wait_site = site
            samples = track.wait_samples
            samples.append((track.stack.taken_at, site is not None))
            while samples and samples[0][0] < track.stack.taken_at - WAIT_SHARE_WINDOW_S:
                samples.popleft()
        if rr.sockets is not None:  # None: a delta report, sockets unchanged
            track.sockets_since = _sockets_since(track.sockets_since, rr.sockets, received_at)
        if rr.env:
            track.env = dict(rr.env)
        if rr.error_file is not None and rr.error_file.message:
            track.error_file_message = rr.error_file.message
        if rr.compute_dtype is not None:
            track.compute_dtype = rr.compute_dtype
        if rr.compute_dtype_line is not None:
            track.compute_dtype_line = rr.compute_dtype_line
        if rr.log_phase is None:
            track.log_phase = None  # the agent saw a step since: the phase is over
        else:
            # The agent re-sends its latest phase line: a new one is known by the agent's clock.
            if rr.log_phase.seen_at != track.log_phase_mark:
                track.log_phase_mark = rr.log_phase.seen_at
                track.log_phase = LogPhase(rr.log_phase.phase, rr.log_phase.seen_at + offset, rr.log_phase.line)
                job.mark_phase(track.log_phase.seen_at, track.log_phase.phase)
        # null: no dump, or the same one (a delta); the agent re-sends it in full reports.
        if rr.flight_recorder is not None and rr.flight_recorder != track.flight_recorder_report:
            track.flight_recorder_report = rr.flight_recorder
            track.flight_recorder = flight_record(rr.flight_recorder, offset)
        if rr.progress is not None:
            self._apply_progress(job, track, node, rr.progress, received_at, offset)

    def _job_of_workers(self, node: str, worker_pids: list[int]) -> str | None:
        """The job whose ranks on ``node`` are this launcher's workers (a launcher that names no job)."""
        pids = set(worker_pids)
        if not pids:
            return None
        for job in self.jobs.values():
            if any(t.node == node and t.pid in pids for t in job.ranks.values()):
                return job.job_id
        return None

    def _apply_launcher(
        self, job: JobTrack, node: str, lr: LauncherReport, received_at: float, offset: float
    ) -> None:
        job.last_report_at = max(job.last_report_at, received_at)
        track = job.launchers.get((node, lr.pid))
        if track is None:
            track = job.launchers[(node, lr.pid)] = LauncherTrack(
                job_id=job.job_id, node=node, pid=lr.pid, first_seen_at=received_at, observed_at=received_at, latest=lr
            )
            job.lifecycle_revision += 1
        track.latest = lr
        track.observed_at = received_at
        errors = _merge_lines(track.log_errors, lr.log_errors, LOG_ERRORS_KEPT)
        if errors != track.log_errors or track.alive != lr.alive or track.vanished:
            job.lifecycle_revision += 1
        track.vanished = False
        track.log_errors = errors
        track.alive = lr.alive
        track.exit = None if lr.alive else _exit_view(track.exit, lr.exit, track.log_errors, received_at, offset)
        if lr.stack is not None:
            track.stack = to_stack(lr.stack, offset)
        track.sockets_since = _sockets_since(track.sockets_since, lr.sockets, received_at)

    def _apply_progress(
        self, job: JobTrack, track: RankTrack, node: str, p: ProgressReport, received_at: float, offset: float
    ) -> None:
        if p.scope == "job":
            cursor = job.progress_cursors.setdefault((node, p.source), ProgressCursor())
        else:
            cursor = track.progress_cursor
        changed = cursor.events is not None and p.events != cursor.events
        first_sight = cursor.events is None
        cursor.events = p.events
        points = [(t, step) for t, step in p.recent if cursor.mark is None or t > cursor.mark]
        new = [t for t, _ in points]
        if not new and (changed or (first_sight and p.events > 0)):
            # Progress without a cadence list: fall back on when the agent saw the line.
            if p.step_at is not None and (cursor.mark is None or p.step_at > cursor.mark):
                new = [p.step_at]
            elif changed:
                new = [received_at - offset]
            if new and p.step is not None:
                points = [(new[0], p.step)]
        if not new:
            return
        cursor.mark = max(new)
        shifted = sorted(t + offset for t in new)
        shifted_points = sorted((t + offset, step) for t, step in points)
        if p.scope == "job":
            _add_times(job.progress_times, shifted)
            _add_points(job.progress_points, shifted_points)
            if job.job_step_at is None or shifted[-1] >= job.job_step_at:
                job.job_step, job.job_step_at = p.step, shifted[-1]
        else:
            _add_times(track.progress_times, shifted)
            _add_points(track.progress_points, shifted_points)
            track.last_progress_at = track.progress_times[-1]

    def _learn_wait_sites(self, job: JobTrack) -> None:
        """A wait site counts as a regular sync point once the job progressed after a stack showed it."""
        progressed_at = job.last_progress_at
        if progressed_at is None:
            return
        for track in job.ranks.values():
            site = track.pending_wait_site
            if site and track.stack is not None and track.stack.taken_at < progressed_at:
                if len(job.known_wait_sites) < KNOWN_SITES_KEPT:
                    job.known_wait_sites.add(site)
                track.pending_wait_site = None

    def make_room_for_node(self, node: str, max_nodes: int, now: float, silent_s: float) -> str | None:
        """At ``max_nodes``, forget the longest-silent node to let a new ``node`` in, if it has been
        silent for over ``silent_s`` (the job retention: its jobs are forgotten already). A silent
        node is kept for its alert (SILENT_NODE_KEPT_S), never at the cost of refusing a live one.
        Returns the node forgotten, if any."""
        if node in self.nodes or len(self.nodes) < max_nodes or not self.nodes:
            return None
        oldest = min(self.nodes, key=lambda name: self.nodes[name].last_report_at)
        if now - self.nodes[oldest].last_report_at <= silent_s:
            return None
        del self.nodes[oldest]
        return oldest

    def prune(self, now: float, retention_s: float) -> list[str]:
        """Forget jobs that ended, or that no agent mentioned, more than ``retention_s`` ago."""
        dropped = []
        for job_id, job in list(self.jobs.items()):
            ended_at = job.ended_at
            if now - job.last_report_at > retention_s or (ended_at is not None and now - ended_at > retention_s):
                del self.jobs[job_id]
                dropped.append(job_id)
                pids = frozenset((t.node, t.pid) for t in (*job.ranks.values(), *job.launchers.values()))
                for name in (job_id, *job.aliases):
                    self.aliases.pop(name, None)
                    self.forgotten[name] = now
                    self.forgotten_pids[name] = pids
        for name, node in list(self.nodes.items()):
            if now - node.last_report_at > max(retention_s, SILENT_NODE_KEPT_S):
                del self.nodes[name]
        for job_id, at in list(self.forgotten.items()):
            if now - at > FORGOTTEN_KEPT_S:
                del self.forgotten[job_id]
                self.forgotten_pids.pop(job_id, None)
        return dropped


def _host_port(job_id: str) -> tuple[str, int] | None:
    """("node0", 29500) from "node0:29500" (or "[fd00::1]:29500"); None for other ids."""
    host, sep, port = job_id.rpartition(":")
    if not sep or not host or not port.isdecimal() or host in ("local", "slurm"):
        return None
    return host, int(port)


def to_stack(report: StackReport, offset: float) -> Stack:
    main = report.threads[0] if report.threads else None
    frames = tuple(Frame(f.name, f.file, f.line, f.native) for f in main.frames) if main else ()
    return Stack(
        taken_at=report.taken_at + offset,
        frames=frames,
        native=report.native,
        active=main.active if main else None,
    )


def launcher_world_size(lr: LauncherReport) -> int | None:
    """nnodes x nproc_per_node when both are integers ("1:4" counts as 4); else None."""
    nnodes, nproc = _max_int(lr.nnodes), _max_int(lr.nproc_per_node)
    return nnodes * nproc if nnodes and nproc else None


def _max_int(text: str | None) -> int | None:
    if not text:
        return None
    parts = text.strip().split(":")
    if not all(p.strip().isdecimal() for p in parts):
        return None
    return max(int(p) for p in parts)


def _nccl_ras(report: Report, previous: NodeTrack | None, offset: float) -> NcclRasTrack | None:
    """The node's RAS answer after this report: a delta's null keeps the last one, a full report's
    null means the agent does not poll."""
    answer = report.nccl_ras
    if answer is None:
        return previous.nccl_ras if previous is not None and report.delta else None
    since = answer.unchanged_since if answer.unchanged_since is not None else answer.polled_at
    return NcclRasTrack(answer.polled_at + offset, min(since, answer.polled_at) + offset, answer)


def _sockets_since(previous: dict[SocketKey, float], sockets: list[SocketReport], received_at: float) -> dict[SocketKey, float]:
    """Keep the first-seen time of every socket still reported in the same state; new ones start now."""
    return {key: previous.get(key, received_at) for key in ((s.local, s.remote, s.state) for s in sockets)}


def _exit_view(
    current: ExitView | None, reported: ExitReport | None, log_errors: list[str], received_at: float, offset: float
) -> ExitView:
    error = log_errors[-1] if log_errors else None
    if reported is not None:
        return ExitView(at=reported.at + offset, code=reported.code, signal=reported.signal, error=error)
    if current is None:
        return ExitView(at=received_at, error=error)
    return ExitView(at=current.at, code=current.code, signal=current.signal, error=error)


def _mark_vanished(track: RankTrack | LauncherTrack) -> None:
    track.alive = False
    track.vanished = True
    error = track.log_errors[-1] if track.log_errors else None
    track.exit = ExitView(at=track.observed_at, error=error)


def _add_times(times: deque[float], new: Iterable[float]) -> None:
    for t in new:
        if len(times) >= 2 and times[-1] == times[-2] == t:
            # Several steps read in one go share a time: two of them tell the cadence that a
            # sighting brought more than one step (diagnosis.cadence), and the history then
            # spans PROGRESS_HISTORY / 2 sightings, so a pause is remembered, however fast the steps.
            continue
        if times and t < times[-1]:
            # Rare (two logs of one job on different clocks): keep the list ordered.
            merged = sorted([*times, t])
            times.clear()
            times.extend(merged[-(times.maxlen or len(merged)) :])
        else:
            times.append(t)


def _add_points(points: deque[tuple[float, int]], new: Iterable[tuple[float, int]]) -> None:
    """Like ``_add_times``, for (time, step) points."""
    for point in new:
        if points and point[0] < points[-1][0]:
            merged = sorted([*points, point])
            points.clear()
            points.extend(merged[-(points.maxlen or len(merged)) :])
        else:
            points.append(point)


def _merge_lines(old: list[str], new: list[str], keep: int) -> list[str]:
    """Append ``new`` to ``old``, skipping the part of ``new`` that repeats the tail of ``old``.

    Works whether the agent sends its whole recent window each time or only new lines.
    """
    if not new:
        return old
    for overlap in range(min(len(old), len(new)), 0, -1):
        if old[-overlap:] == new[:overlap]:
            return (old + new[overlap:])[-keep:]
    return (old + new)[-keep:]
