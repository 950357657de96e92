"""What the monitor keeps about each rank, launcher and node: the records ingest updates.

Every time in them is on the monitor's clock (see ``monitor.ingest.state``). The job's own record,
which gathers its ranks and launchers, is ``monitor.ingest.job_track.JobTrack``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from monitor.diagnosis import ExitView, HostFacts, LogPhase, RankView, Stack
from monitor.diagnosis.model import CPU_LEVEL_WINDOW_S, FlightRecord
from monitor.diagnosis.slow_rank import (
    CPU_LEVEL_EVERY,
    CPU_LEVEL_MIN_REPORTS,
    CPU_LEVEL_MIN_SAMPLES,
    CPU_LEVEL_MIN_SPAN,
)
from monitor.ingest.report_order import LastTaken, Run
from monitor.ingest.wire import (
    AgentInfo,
    CollectorHealth,
    FlightRecorderReport,
    HostReport,
    LauncherReport,
    NcclRasReport,
    OrphanReport,
    RankReport,
    SocketReport,
)

PROGRESS_HISTORY = 64
# Recent (monitor time, step) points per rank and per job, for the page's progress chart.
PROGRESS_POINTS_KEPT = 120
# Stack samples kept per rank for the collective wait share, and over how long.
WAIT_SAMPLES_KEPT = 1024
WAIT_SHARE_WINDOW_S = 600.0
WAIT_SHARE_MIN_SAMPLES = 5
# Per-report samples kept per rank for each steady level (monitor.diagnosis.slow_rank).
LEVEL_SAMPLES_KEPT = 120

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
class Level:
    """A rank's steady level of a per-report figure: the median of its samples over a window,
    worked out again once a sixth of the window has passed, from at least half the samples the
    window should hold spanning two thirds of it (one report a second: 15 samples over 20 s of the
    default half-minute). The window is the straggler window, or CPU_LEVEL_MIN_REPORTS of the
    rank's own report intervals where that is longer (one report every 10 s: 80 s). While the job
    does not step the level stays as it was; a window stretched past the straggler window (the rule
    checks the job's steps over that one only: monitor.diagnosis.slow_rank) gives no level while
    such a stop lies inside it. None until the window holds enough."""

    # Made at the first sample: most ranks of most agents never send some of the figures.
    samples: deque[tuple[float, float]] | None = None
    value: float | None = None
    at: float | None = None
    # The window, worked out with the level (0: the straggler window, until then).
    span_s: float = 0.0
    # The latest sample the level was due at while the job had not stepped since the last one.
    paused_at: float | None = None

    def add(self, at: float, sample: float, window_s: float = CPU_LEVEL_WINDOW_S,
            progressed_at: float | None = None) -> None:
        """One more sample, taken at ``at``; ``progressed_at``: the job's latest step (None: the job
        logs none, and levels follow every sample)."""
        samples = self.samples
        if samples is None:
            samples = self.samples = deque(maxlen=LEVEL_SAMPLES_KEPT)
        samples.append((at, sample))
        span = self.span_s or window_s
        while samples[0][0] < at - span:
            samples.popleft()
        if self.at is not None:
            if at - self.at < span * CPU_LEVEL_EVERY:
                return
            if progressed_at is not None and progressed_at <= self.at:
                # A hang, a checkpoint: its samples would move the levels of the ranks whose nodes
                # reported since it began, and not yet the others'.
                self.paused_at = at
                return
        self.at = at
        # The rank's report interval, on average over the samples kept: worked out with the level
        # only (ingest is the hot path).
        count = len(samples)
        interval = (at - samples[0][0]) / (count - 1) if count > 1 else 0.0
        span = self.span_s = max(window_s, CPU_LEVEL_MIN_REPORTS * interval)
        expected = span / interval if interval else span
        if (count < expected * CPU_LEVEL_MIN_SAMPLES or at - samples[0][0] < span * CPU_LEVEL_MIN_SPAN
                or (span > window_s and self.paused_at is not None and self.paused_at >= at - span)):
            self.value = None
            return
        self.value = median(p for _, p in samples)


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
    # Reported alive at least once: a rank only ever said to have ended is a node's word, not the
    # rank's own evidence (monitor/engine/attribution.py: no action rests on it alone).
    seen_alive: bool = False
    exit: ExitView | None = None
    # True when the agent stopped listing this rank without saying it ended.
    vanished: bool = False
    proc_state: str | None = None
    state_since: float | None = None
    idle_since: float | None = None
    # Where the interval of its latest CPU reading began (RankView.cpu_since).
    cpu_since: float | None = None
    # The last report in which the rank was at work (CPU at or over the idle level, or data moving).
    worked_at: float | None = None
    # Where the stacks taken since the rank went idle show its main thread (its Python frames), how
    # many in a row show it there, and that place as the job's wait profile names it (a wait site,
    # or the top frame): RankView.held_stacks.
    held_place: tuple[tuple[str, str, int | None], ...] | None = None
    held_stacks: int = 0
    held_site: str = ""
    # Since when it has been at held_place as far as known (when it went idle, or the last stack
    # that showed it elsewhere), and when the latest of those stacks was taken.
    held_since: float | None = None
    held_last_at: float | None = None
    # The last report in which its main thread used any CPU: a thread parked in a collective or a
    # blocked call uses none, a light job's loop some every second (ThreadsReport.main_cpu_percent).
    main_moved_at: float | None = None
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
    # Counts every change ingest makes to this track, and the progress history's own changes:
    # monitor/engine/views.py keeps the rank's view (and its slow parts) until they move, so a pass over
    # a 10,000-rank job rebuilds only the ranks that reported since the last one.
    revision: int = 0
    progress_revision: int = 0
    view_cache: tuple[int, RankView] | None = None  # (revision, the view at it)
    view_parts: dict[str, tuple[object, object]] = field(default_factory=dict)

    # How many of ``wait_samples`` waited: kept with them, so the share costs nothing per pass.
    wait_samples_waiting: int = 0
    # Per-report levels (medians over the straggler window): the CPU it used, and the CPU denied to
    # it (its main thread waiting in a run queue; its cgroup throttled by a quota).
    cpu: Level = field(default_factory=lambda: Level())
    run_queue_wait: Level = field(default_factory=lambda: Level())
    cpu_throttled: Level = field(default_factory=lambda: Level())
    cgroup: str | None = None
    # The latest full list of its sockets, by key (a delta report leaves it as it was).
    socket_reports: dict[SocketKey, SocketReport] = field(default_factory=dict)

    def add_wait_sample(self, taken_at: float, waiting: bool) -> None:
        """One more stack sample; samples older than the window before it are dropped."""
        samples = self.wait_samples
        if len(samples) == samples.maxlen:
            self.wait_samples_waiting -= samples.popleft()[1]
        samples.append((taken_at, waiting))
        self.wait_samples_waiting += waiting
        while samples and samples[0][0] < taken_at - WAIT_SHARE_WINDOW_S:
            self.wait_samples_waiting -= samples.popleft()[1]

    def wait_share(self, now: float) -> float | None:
        """Share of the recent stack samples that waited in a collective; None below the minimum count."""
        old = old_waiting = 0
        for at, waiting in self.wait_samples:  # oldest first: usually none is out of the window
            if at >= now - WAIT_SHARE_WINDOW_S:
                break
            old += 1
            old_waiting += waiting
        count = len(self.wait_samples) - old
        if count < WAIT_SHARE_MIN_SAMPLES:
            return None
        return (self.wait_samples_waiting - old_waiting) / count


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
    # False while the node's latest report is one its agent kept through an outage: a picture of
    # the past however recent its time, never read as the node's present (is_fresh, below).
    live: bool = True
    # True while the node's latest report is a delta this process cannot build on (no full report
    # from the node since it started): parts of the picture may be older than the report.
    partial: bool = False
    # The latest report came with a token bound to this node (monitor/web/auth.py): no other node sent it.
    attributed: bool = False
    # The latest report's number in its agent's run (monitor/ingest/report_order.py); None: not numbered.
    seq: int | None = None
    # The runs of the agent this node replaced (monitor/ingest/report_order.py): none is taken again.
    past_runs: tuple[Run, ...] = ()

    def last_taken(self) -> LastTaken:
        return LastTaken(self.agent.started_at, self.agent.pid, self.seq, self.last_report_at, self.past_runs,
                         self.offset)
    # (host report, its HostFacts) for monitor/engine/views.host_facts: the facts change only with the host.
    facts_cache: tuple[HostReport, HostFacts] | None = None


@dataclass
class ClaimConflict:
    """A node's refused claim to a rank another node holds."""

    rank: int
    claimed_by: str
    held_by: str
    first_at: float
    last_at: float
    refused: int = 1
    # Why it was refused when not because ``held_by`` runs the rank: the rank is past the world
    # size ``held_by``'s live ranks of the job report.
    reason: str = ""


# A node counts as reporting while its agent's last report is at most this old
# (or three of its intervals, for an agent that reports less often).
NODE_FRESH_S = 10.0


def is_fresh(node: NodeTrack, now: float) -> bool:
    """The node's last report says what is true at ``now``. One replayed from the agent's outage
    journal does only at its own time (the monitor judges it then, for the job's history); read
    later it is the past, however recent: after a short outage it can be seconds old and show a
    job in the middle of failing, a false verdict until the node's first live report. A delta the
    monitor cannot build on (``NodeTrack.partial``) is not the present either, until the full report."""
    return not node.partial and heard_lately(node, now)


def heard_lately(node: NodeTrack, now: float) -> bool:
    """The node's agent reported live within its freshness window, whether or not the monitor can
    build on what it sent (``is_fresh`` less ``partial``): after a restart, a node whose full report
    is still on its way is heard, its restored ranks its own."""
    if not node.live and now > node.last_report_at:
        return False
    return now - node.last_report_at <= max(NODE_FRESH_S, 3 * (node.agent.interval_s or 0.0))
