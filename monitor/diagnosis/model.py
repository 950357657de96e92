"""Inputs and outputs of the diagnosis: plain, immutable values.

The monitor turns its stored reports into a ``JobView`` (times already on the
monitor's clock) and calls ``diagnose(job)``; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Literal, NamedTuple

from monitor.diagnosis.verdict_catalogue import VERDICTS as VERDICTS  # every verdict: the catalogue's names


# The default window of a rank's CPU level (monitor.ingest.tracks, diagnosis.slow_rank): the monitor's
# straggler_window_s setting.
CPU_LEVEL_WINDOW_S = 30.0


class Frame(NamedTuple):
    """One stack frame. A named tuple, not a dataclass: a giant job's answer groups its 10,000
    ranks by their frames, and a tuple of these hashes and compares in C (a 12-frame stack:
    0.3 us against 1.4 for frozen dataclasses, and 0.45 against 1.9 to compare)."""

    name: str
    file: str = ""
    line: int | None = None
    native: bool = False

    @property
    def short_file(self) -> str:
        """The path from the package root on (``torch/distributed/...``), else the base name."""
        return _short_file(self.file)

    def where(self) -> str:
        if self.native or not self.file:
            return self.name
        line = f":{self.line}" if self.line is not None else ""
        return f"{self.name} ({self.short_file}{line})"


@lru_cache(maxsize=8192)
def _short_file(path: str) -> str:
    # Memoised: thousands of ranks' stacks name the same few hundred files.
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    return parts[-1] if parts else ""


@dataclass(frozen=True)
class Stack:
    taken_at: float
    # Main thread, innermost frame first.
    frames: tuple[Frame, ...]
    native: bool = False
    # py-spy's view of the main thread: False = idle (waiting), True = running.
    active: bool | None = None

    @cached_property
    def outline(self) -> tuple[tuple[str, bool], ...]:
        """The frames as ``(text, native)``, outermost first, without the native frames outside the
        outermost Python frame: the interpreter's start-up (``_start``, ``Py_RunMain``, ...) says
        nothing about where a rank is and differs between dumps. Made once per dump: the merged
        stack tree groups thousands of ranks by it at every refresh."""
        frames = self.frames
        python = [i for i, f in enumerate(frames) if not f.native]
        if python:
            frames = frames[: python[-1] + 1]
        return tuple((f.where(), f.native) for f in reversed(frames))


@dataclass(frozen=True)
class ExitView:
    at: float
    code: int | None = None
    signal: int | None = None
    # The last error this rank printed (e.g. "RuntimeError: ... Connection closed by peer").
    error: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.signal) or (self.code not in (0, None)) or self.error is not None


@dataclass(frozen=True)
class Socket:
    local: str  # "10.0.0.1:41234"
    remote: str  # "10.0.0.2:29500"
    state: str  # SYN_SENT, ESTABLISHED, LISTEN, ...
    # Since when (monitor clock) this connection has been in this state, as far as seen.
    since: float | None = None
    # How well the link carries it (an established connection whose tcp_info the agent read): the
    # smoothed round-trip time and the lowest of the last minutes (the link's own delay), segments
    # retransmitted per second, and bytes queued to send.
    rtt_ms: float | None = None
    min_rtt_ms: float | None = None
    retrans_per_s: float | None = None
    send_queue_bytes: int | None = None

    @property
    def remote_host(self) -> str:
        return self.remote.rsplit(":", 1)[0].strip("[]")

    @property
    def remote_port(self) -> int | None:
        tail = self.remote.rsplit(":", 1)[-1]
        return int(tail) if tail.isdecimal() else None


@dataclass(frozen=True)
class LogPhase:
    """The latest log line that announced a phase pausing step progress."""

    phase: str  # "evaluation", "checkpoint" or "compilation"
    seen_at: float  # monitor clock
    line: str = ""


@dataclass(frozen=True)
class FrEntry:
    """One collective a rank's Flight Recorder recorded."""

    seq: int | None
    op: str  # "all_reduce", "broadcast", ...
    state: str = ""
    created_at: float | None = None  # monitor clock
    p2p: bool = False


@dataclass(frozen=True)
class FrGroup:
    """How far one rank got in one process group, by its Flight Recorder dump."""

    pg: str  # the group's name ("0": the default group), the same on every rank
    desc: str = ""
    size: int | None = None
    # Sequence ids of the last collective enqueued, started and completed (-1: none yet).
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    recent: tuple[FrEntry, ...] = ()  # oldest first

    def op_of(self, seq: int | None) -> str | None:
        """The name of collective ``seq``, when the dump's last entries still hold it."""
        return next((e.op for e in reversed(self.recent) if not e.p2p and e.seq == seq and e.op), None)


@dataclass(frozen=True)
class FlightRecord:
    """A rank's latest PyTorch Flight Recorder dump."""

    dumped_at: float  # monitor clock
    path: str = ""
    status: str = "ok"  # or why it could not be read
    groups: tuple[FrGroup, ...] = ()


@dataclass(frozen=True)
class BlockedIo:
    """The file-system call a rank's main thread sits in (agent/blocked_io.py), from its latest report."""

    syscall: str  # "openat", "write", "fsync", ...
    path: str | None = None


@dataclass(frozen=True)
class RankView:
    rank: int
    node: str
    pid: int | None
    alive: bool
    observed_at: float
    first_seen_at: float
    exit: ExitView | None = None
    # Kernel state letter (R S D T t Z), and since when the rank has been in it.
    proc_state: str | None = None
    state_since: float | None = None
    cpu_percent: float | None = None
    # The start of the interval ``cpu_percent`` covers (the rank's report before; None: its first): a
    # reading from an agent that reports every 10 s may be mostly of the time before a stall began.
    cpu_since: float | None = None
    # The median of its CPU percent over the last half-minute of reports (monitor.ingest.tracks): the work
    # it does per second, steady enough to compare ranks by. None until the window is full enough.
    cpu_level_percent: float | None = None
    # The seconds that level spans: the straggler window, or longer for a rank reported seldom
    # (monitor.ingest.tracks.Level). None where not known (a member of a relay's group).
    cpu_level_span_s: float | None = None
    # Since when CPU has stayed below the idle threshold without a break (None: it is not).
    idle_since: float | None = None
    write_bytes_per_s: float | None = None
    # The last report in which it moved data (writes, sends) at a working rate: bursts
    # (write, fsync, pause) are judged over a window, not by the latest sample alone.
    moved_at: float | None = None
    step: int | None = None
    # How the agent read the step: a built-in pattern's name, "user", or "learned (...): template"
    # for a line format it learned (agent/progress_learner.py).
    progress_pattern: str | None = None
    # Progress seen in this rank's own log lines, oldest first (monitor clock).
    progress_times: tuple[float, ...] = ()  # in time order
    stack: Stack | None = None
    stack_error: str | None = None
    log_phase: LogPhase | None = None
    log_errors: tuple[str, ...] = ()
    # Selected launch settings from the rank's environment (GLOO_SOCKET_IFNAME, MASTER_ADDR, ...).
    env: tuple[tuple[str, str], ...] = ()
    sockets: tuple[Socket, ...] = ()
    # The message in the rank's TORCHELASTIC_ERROR_FILE, when it wrote one.
    error_file_message: str | None = None
    compute_dtype: str | None = None
    compute_dtype_line: str | None = None
    # Mean utilisation of the rank's GPUs (0-100), when the node has NVML.
    gpu_utilization_percent: float | None = None
    # Its slowest GPU's SM clock and that GPU's maximum (MHz), and why NVML says any of its GPUs' clocks
    # are held down now (the reasons that slow work: thermal, power, hardware slowdown).
    gpu_sm_clock_mhz: int | None = None
    gpu_max_sm_clock_mhz: int | None = None
    gpu_slowdown_reasons: tuple[str, ...] = ()
    # Share (0-1) of this rank's recent stack samples that were waiting in a collective:
    # how communication-bound the job is. None until enough samples.
    collective_wait_share: float | None = None
    # The rank's latest PyTorch Flight Recorder dump, when the job wrote one.
    flight_recorder: FlightRecord | None = None
    # How many stacks in a row, all taken since the rank went idle (``idle_since``) after it was seen
    # at work, show its main thread at one place (the same Python frames): 0 when none does. With
    # idle CPU and no bytes moving, the rank's own word that it has not moved since ``held_since``.
    held_stacks: int = 0
    # Since when, as far as known: when it went idle, or when a stack last showed it elsewhere, or when its
    # main thread last used CPU, whichever is latest (None when not held).
    held_since: float | None = None
    # Seconds per step from the steps its log printed (the recent median), when they are numbered.
    step_time_s: float | None = None
    # The file-system call its main thread is blocked in, while it looks stuck (None: none).
    blocked_io: BlockedIo | None = None
    # Recent (time, step) points of its own log (monitor clock), oldest first: the page's chart.
    progress_points: tuple[tuple[float, int], ...] = ()
    # The launcher its agent saw, and how the agent knew the rank ("env:RANK", "mp.spawn:start-order").
    launcher: str | None = None
    identified_by: str | None = None
    # CPU time denied to it, in percent of wall time, as levels like ``cpu_level_percent`` (the median
    # over the same window): its main thread runnable in a run queue, waiting for a core (a
    # neighbour on its cores), and its cgroup throttled by a CPU quota. None until measured.
    run_queue_wait_level_percent: float | None = None
    cpu_throttled_level_percent: float | None = None
    cgroup: str | None = None

    def env_value(self, name: str) -> str | None:
        return dict(self.env).get(name)


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: tuple[str, ...] = ()  # bare addresses, no prefix length
    up: bool = True


@dataclass(frozen=True)
class HostFacts:
    cpu_flags: frozenset[str] = frozenset()
    cpu_model: str = ""
    interfaces: tuple[Interface, ...] = ()


@dataclass(frozen=True)
class LauncherView:
    """A launcher (torchrun's elastic agent) of this job on one node."""

    node: str
    pid: int
    alive: bool
    first_seen_at: float
    node_rank: int | None = None
    nnodes: str | None = None
    nproc_per_node: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    worker_count: int = 0
    stack: Stack | None = None
    sockets: tuple[Socket, ...] = ()
    log_errors: tuple[str, ...] = ()
    exit: ExitView | None = None


@dataclass(frozen=True)
class OrphanView:
    """A leftover process on a node whose parent is gone (PPID 1)."""

    node: str
    pid: int
    cmdline: str
    listening_ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class NcclRank:
    """A rank of an NCCL communicator, as NCCL's RAS service counts its collectives."""

    comm_rank: int
    # The job's rank: the tracked process with this pid on the reporting node; None if none is.
    rank: int | None
    node: str
    pid: int | None
    host: str = ""
    # (collective type, how many were launched), e.g. ("AllReduce", 64).
    counts: tuple[tuple[str, int], ...] = ()
    async_error: str | None = None  # by name: "remote error", "invalid usage", ...
    flags: tuple[str, ...] = ()  # "aborted", "destroyed", "finalized"


@dataclass(frozen=True)
class NcclMissingRank:
    """A rank of a communicator the RAS service got no data from."""

    comm_rank: int
    rank: int | None
    pid: int | None
    host: str = ""
    unresponsive: bool = False
    considered_dead: bool = False


@dataclass(frozen=True)
class NcclComm:
    """One NCCL communicator of the job, joined from the RAS answers of its nodes."""

    hash: str
    size: int
    # When its oldest part was read, and since when no part has changed (monitor clock).
    polled_at: float
    unchanged_since: float
    ranks: tuple[NcclRank, ...] = ()
    missing: tuple[NcclMissingRank, ...] = ()


@dataclass(frozen=True)
class PaceView:
    """The job's pace against its own best (monitor.ingest.pace): seconds per progress event now and at
    its best settled stretch of the last hour, their ratio (> 1: slower), since when it has been
    slow (SLOW_RATIO times the baseline or more), and goodput (progress made over what the baseline
    pace makes in the same time, since the baseline settled; 1 at pace, 0 stalled)."""

    baseline_s: float
    now_s: float
    ratio: float
    slow_since: float | None = None
    goodput: float | None = None
    settled_at: float | None = None


@dataclass(frozen=True)
class JobView:
    job_id: str
    world_size: int
    now: float
    first_seen_at: float
    ranks: tuple[RankView, ...]
    # Progress seen in job-level logs (a rank-0-only log, unprefixed shared lines).
    job_progress_times: tuple[float, ...] = ()
    job_step: int | None = None
    # Collective call sites ("all_reduce@train.py:50") seen while the job progressed:
    # the job's regular sync points, used to tell the odd one out.
    known_wait_sites: frozenset[str] = frozenset()
    hosts: dict[str, HostFacts] = field(default_factory=dict)
    # Whether stacks can be taken at all on the nodes of this job (py-spy present and permitted).
    stacks_unavailable_reason: str | None = None
    launchers: tuple[LauncherView, ...] = ()
    # Leftover processes on the job's nodes (stale runs holding ports).
    orphans: tuple[OrphanView, ...] = ()
    # Nodes with a live agent, whatever job they run: a node that reports but has no
    # rank of this job is a node where the job never started.
    nodes_reporting: frozenset[str] = frozenset()
    # (time, phase) when some rank was seen in a phase that pauses progress (a log line or
    # a stack), oldest first: which silent stretches of the past were evaluations,
    # checkpoints or compilations, so steps and each phase get a pace of their own.
    phase_marks: tuple[tuple[float, str], ...] = ()
    # The job's NCCL communicators as NCCL's RAS service sees them (empty without NCCL).
    nccl: tuple[NcclComm, ...] = ()
    # (node, its agent's last report) for each node of the job whose agent stopped reporting:
    # what the monitor holds of its ranks is old, and is no evidence for anything.
    silent_nodes: tuple[tuple[str, float], ...] = ()
    # (node, the time of its latest report) for each node of the job whose latest report is one its
    # agent kept through an outage and delivers now (no live report since): judged at that report's
    # time, the job is the past as it happened; judged later, its present is not known yet.
    replaying_nodes: tuple[tuple[str, float], ...] = ()
    # When this monitor process started: reports from before it were replayed from storage.
    monitor_started_at: float | None = None
    # The window of the ranks' CPU levels (RankView.cpu_level_percent), seconds.
    cpu_level_window_s: float = CPU_LEVEL_WINDOW_S
    # The job's rhythm read from its ranks' CPU, for a job that logs no progress: when a rank
    # was first seen at work, and the longest pause (idle, then at work again) any rank came
    # back from; 0 while none did (fast steps never show idle at one sample a second).
    working_since: float | None = None
    longest_pause_s: float = 0.0
    # The job's wait profile: (place, the longest pause a rank came back from there), where the place
    # is the wait site ("all_reduce@train.py:50") or the top frame of the rank's stack while it
    # paused, and "" for pauses no stack saw (monitor.ingest.rank_ingest).
    pauses_by_site: tuple[tuple[str, float], ...] = ()
    # Seconds per step from the job-level log's numbered steps (the recent median), when known.
    job_step_time_s: float | None = None
    # The job's pace against its own history; None until a baseline settled.
    pace: PaceView | None = None


RankState = Literal[
    "running",  # advancing normally
    "computing",  # busy (high CPU), not waiting on peers
    "in_collective",  # parked in a collective, waiting on peers
    "sending",  # in a collective with bytes still moving
    "rendezvous",  # initialising the process group / rendezvous
    "idle",  # low CPU, not in a collective (sleeping, blocked on I/O, lingering)
    "stopped",  # SIGSTOP / job control / tracer stop
    "exited",  # ended with exit code 0
    "failed",  # ended with an error, a non-zero code or a signal
    "unknown",  # not enough data yet
]


class RankDiagnosis(NamedTuple):
    """A rank's state in a diagnosis: a named tuple (one per rank per pass; made in C)."""

    rank: int
    state: str
    top_frame: str | None = None
    # Where it waits, e.g. "all_reduce@train.py:50"; None when not in a collective.
    wait_site: str | None = None


@dataclass(frozen=True)
class WaitGroup:
    """Ranks that wait at the same place (collective kind and call site)."""

    site: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Diagnosis:
    verdict: str
    culprit_ranks: tuple[int, ...]
    since: float | None
    summary: str
    evidence: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    ranks: tuple[RankDiagnosis, ...] = ()
    groups: tuple[WaitGroup, ...] = ()
    # Built on a fact that cannot turn back (a launcher that exited with its error): published
    # without the confirmation alarms otherwise wait for (diagnosis.stability).
    final: bool = False
    # Progress lines read after this time were not counted: the ranks' own state says they were
    # not training (diagnosis.held). None when every line counted.
    progress_discounted_after: float | None = None
