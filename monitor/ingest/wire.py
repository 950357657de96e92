"""The agent-to-monitor report, as the monitor validates it.

This is the one definition of the wire format: the agent builds plain dicts of
this shape (it does not import pydantic models), and a contract test checks
the agent's real output against these models.

Times are the agent's wall clock (seconds since the epoch); the monitor shifts
them onto its own clock using ``sent_at`` and the time it received the report.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

ShortStr = Annotated[str, Field(max_length=256)]
LineStr = Annotated[str, Field(max_length=2048)]
# Every number is bounded: NaN, Infinity and integers past 64 bits are refused at ingest,
# because one such value once stored made every JSON answer and /metrics fail (and came back
# after a restart through replay). Narrower bounds on a field add to these.
Int = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Float = Annotated[float, Field(allow_inf_nan=False, ge=-1e300, le=1e300)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FrameReport(_Strict):
    """One stack frame, innermost first in its list."""

    name: ShortStr
    file: Annotated[str, Field(max_length=1024)] = ""
    line: Int | None = None
    native: bool = False


class ThreadStackReport(_Strict):
    tid: Int | None = None
    name: ShortStr = ""
    active: bool | None = None
    owns_gil: bool | None = None
    frames: Annotated[list[FrameReport], Field(max_length=256)] = []


class StackReport(_Strict):
    taken_at: Float
    native: bool = False
    duration_s: Float | None = None
    # Main thread first.
    threads: Annotated[list[ThreadStackReport], Field(max_length=64)] = []


class ThreadReport(_Strict):
    tid: Int
    name: ShortStr = ""
    state: Annotated[str, Field(max_length=2)] = "?"
    cpu_percent: Float | None = None


class ThreadsReport(_Strict):
    total: Int = 0
    by_state: dict[Annotated[str, Field(max_length=2)], Int] = {}
    # The busiest few threads, busiest first.
    busiest: Annotated[list[ThreadReport], Field(max_length=32)] = []
    # The main thread's CPU over the interval (100 = a core); null when not known yet.
    main_cpu_percent: Float | None = None


class ExitReport(_Strict):
    at: Float
    code: Int | None = None
    signal: Int | None = None
    # Where the exit status came from: "proc" (zombie's /proc stat), "launcher-log", "unknown".
    source: ShortStr = "unknown"


class ProgressReport(_Strict):
    # Counts every progress line seen since the agent started following the log:
    # it changes whenever the job made progress, even if the printed step resets
    # (per-epoch progress bars).
    events: Int = 0
    step: Int | None = None
    total_steps: Int | None = None
    # When the agent first saw the latest progress line.
    step_at: Float | None = None
    # "rank": lines written by (or prefixed for) this rank; "job": unprefixed lines
    # in a log shared by several ranks, or a rank-0-only log.
    scope: Literal["rank", "job"] = "rank"
    source: Annotated[str, Field(max_length=1024)] = ""
    pattern: ShortStr = ""
    last_line: LineStr | None = None
    # Recent (time, step) pairs, oldest first, so the monitor sees the cadence even
    # when several steps pass between two reports.
    recent: Annotated[list[tuple[Float, Int]], Field(max_length=256)] = []


class LogPhaseReport(_Strict):
    """The latest log line announcing a phase that pauses step progress."""

    phase: Literal["evaluation", "checkpoint", "compilation"]
    # When the agent read the line (its clock, like ProgressReport.step_at).
    seen_at: Float
    line: LineStr = ""


NonNegative = Annotated[Float, Field(ge=0)]
Count = Annotated[Int, Field(ge=0)]


class TcpInfoReport(_Strict):
    """How well the link carries one established connection: the kernel's tcp_info for it, read through
    sock_diag as `ss -ti` does (agent/tcp_info.py). Rates are over the interval since the agent's
    previous reading of the same connection (null on the first)."""

    rtt_ms: Annotated[NonNegative, Field(le=1e7)] | None = None  # smoothed round-trip time
    # The lowest round-trip time in the kernel's window (tcp_min_rtt_wlen, 5 minutes by default): the
    # link's own delay, so rtt_ms far above it is queueing on the way.
    min_rtt_ms: Annotated[NonNegative, Field(le=1e7)] | None = None
    total_retrans: Count | None = None  # segments retransmitted over the connection's life
    retrans_per_s: Annotated[NonNegative, Field(le=1e9)] | None = None
    lost: Count | None = None  # segments the kernel presumes lost right now
    unacked: Count | None = None  # segments sent and not yet acknowledged
    notsent_bytes: Count | None = None  # queued by the process, not yet sent
    delivery_rate_bps: Annotated[NonNegative, Field(le=1e15)] | None = None  # bytes per second
    bytes_acked_per_s: Annotated[NonNegative, Field(le=1e15)] | None = None  # sent and acknowledged


class SocketReport(_Strict):
    """One TCP socket of a process (from /proc/PID/net/tcp{,6} and /proc/PID/fd)."""

    local: ShortStr  # "10.0.0.1:29500" ("[::1]:29500" for IPv6)
    remote: ShortStr
    # SYN_SENT, ESTABLISHED, LISTEN, ... (the kernel's TCP states by name).
    state: Annotated[str, Field(max_length=16)]
    tx_queue: Int | None = None
    rx_queue: Int | None = None
    # Established connections only, where the kernel answers sock_diag; null elsewhere.
    tcp: TcpInfoReport | None = None


class SchedReport(_Strict):
    """How much CPU the rank was denied, over the interval since the agent's previous sample."""

    # Share of the interval (100 = all of it) the rank's main thread sat runnable in a run queue,
    # waiting for a core (/proc/PID/schedstat's run_delay): a neighbour on its cores, or a pinning
    # to too few of them.
    run_queue_wait_percent: Annotated[NonNegative, Field(le=1e4)] | None = None
    # Share of the interval its cgroup was throttled by its CPU quota (cpu.stat's throttled time),
    # and the cgroup (its path under the cgroup root).
    cpu_throttled_percent: Annotated[NonNegative, Field(le=1e4)] | None = None
    cgroup: Annotated[str, Field(max_length=1024, pattern=r"^[^\x00-\x1f\x7f]*$")] = ""


class ErrorFileReport(_Strict):
    """What a rank's TORCHELASTIC_ERROR_FILE (written by ``@record``) says."""

    path: Annotated[str, Field(max_length=1024)]
    message: Annotated[str, Field(max_length=8192)] = ""
    timestamp: Float | None = None


class GpuReport(_Strict):
    index: Int
    utilization_percent: Float | None = None
    memory_used_bytes: Int | None = None
    name: ShortStr = ""
    # The SM clock now and its maximum (NVML), and why the clocks are held down now, by NVML's names
    # ("hw_slowdown", "sw_thermal_slowdown", "sw_power_cap", ...): a GPU slower than its peers says why.
    sm_clock_mhz: Annotated[Int, Field(ge=0, le=100_000)] | None = None
    max_sm_clock_mhz: Annotated[Int, Field(ge=0, le=100_000)] | None = None
    clock_event_reasons: Annotated[list[Annotated[str, Field(max_length=40, pattern=r"^[a-z_]+$")]],
                                   Field(max_length=16)] = []


class FlightRecorderEntryReport(_Strict):
    """One recorded collective (or p2p op) of a process group, from a Flight Recorder dump."""

    seq: Int | None = None  # collective_seq_id (p2p_seq_id for a p2p op)
    op: Annotated[str, Field(max_length=64)] = ""  # "all_reduce", "broadcast", ... (backend prefix cut)
    # torch's entry state: "scheduled", "started", "completed" (gloo leaves every entry "scheduled").
    state: Annotated[str, Field(max_length=16)] = ""
    created_at: Float | None = None  # the rank's clock
    p2p: bool = False


class FlightRecorderGroupReport(_Strict):
    """One process group of a rank's dump: how far the rank got in it (pg_status)."""

    pg: Annotated[str, Field(max_length=64)]  # the group's name, "0" for the default group
    desc: ShortStr = ""  # "default_pg", or the name the job gave it
    size: Int | None = None  # ranks in the group, when the dump says
    # Sequence ids of the last collective the rank enqueued, started and completed (-1: none).
    last_enqueued: Int | None = None
    last_started: Int | None = None
    last_completed: Int | None = None
    # The group's last few entries, oldest first.
    recent: Annotated[list[FlightRecorderEntryReport], Field(max_length=8)] = []


class FlightRecorderReport(_Strict):
    """The latest PyTorch Flight Recorder dump of a rank (agent/flight_recorder.py)."""

    path: Annotated[str, Field(max_length=1024)]
    dumped_at: Float  # the file's mtime, the agent's clock
    size: Int | None = None
    # "ok", or why the file could not be used ("unreadable: truncated ...", "too big: ...").
    status: ShortStr = "ok"
    version: Annotated[str, Field(max_length=64)] = ""
    groups: Annotated[list[FlightRecorderGroupReport], Field(max_length=32)] = []


class BlockedIoReport(_Strict):
    """The file-system call a rank's main thread sits in while it looks stuck (agent/blocked_io.py):
    evidence text only, never a path the monitor opens."""

    syscall: Annotated[str, Field(max_length=32, pattern=r"^[a-z0-9_]+$")]
    # The file, from /proc/PID/fd or from the call's path argument; null when unreadable.
    path: Annotated[str, Field(max_length=1024, pattern=r"^[^\x00-\x1f\x7f]*$")] | None = None
    fd: Annotated[Int, Field(ge=0, lt=2**31)] | None = None


class RankReport(_Strict):
    job_id: Annotated[str, Field(min_length=1, max_length=256)]
    rank: Annotated[Int, Field(ge=0, lt=1_000_000)]
    world_size: Annotated[Int, Field(ge=1, le=1_000_000)]
    local_rank: Int | None = None
    pid: Annotated[Int, Field(ge=1)]
    cmdline: Annotated[str, Field(max_length=4096)] = ""
    launcher: ShortStr = ""
    # How the agent knew the rank: "env:RANK", "env:SLURM_PROCID", "lightning:LOCAL_RANK",
    # "mp.spawn:start-order", ... (agent/identity.py); "" from agents before it was sent.
    identified_by: ShortStr = ""
    started_at: Float | None = None
    alive: bool = True
    exit: ExitReport | None = None
    # Kernel process state letter: R S D T t Z X I.
    state: Annotated[str, Field(max_length=2)] | None = None
    # 100 means one full core.
    cpu_percent: Float | None = None
    cpu_seconds: Float | None = None
    rss_bytes: Int | None = None
    threads: ThreadsReport | None = None
    # Bytes written through write()/send() (wchar in /proc/PID/io).
    wchar: Int | None = None
    write_bytes_per_s: Float | None = None
    progress: ProgressReport | None = None
    log_phase: LogPhaseReport | None = None
    # Error lines from this rank's log (last lines of tracebacks), newest last.
    log_errors: Annotated[list[LineStr], Field(max_length=50)] = []
    stack: StackReport | None = None
    stack_error: LineStr | None = None
    # Launch settings that explain hangs (GLOO_SOCKET_IFNAME, GLOO_PORT_RANGE,
    # NCCL_SOCKET_IFNAME, MASTER_ADDR, MASTER_PORT, ...), from /proc/PID/environ.
    env: Annotated[dict[ShortStr, Annotated[str, Field(max_length=1024)]], Field(max_length=64)] = {}
    # null in a delta report: unchanged since the last report (see ``Report.delta``).
    sockets: Annotated[list[SocketReport], Field(max_length=256)] | None = []
    error_file: ErrorFileReport | None = None
    # The compute dtype the log announces (e.g. "torch.bfloat16"), and the line that says it.
    compute_dtype: ShortStr | None = None
    compute_dtype_line: LineStr | None = None
    gpus: Annotated[list[GpuReport], Field(max_length=16)] = []
    # null: no dump read (or, in a delta report, the same dump as before).
    flight_recorder: FlightRecorderReport | None = None
    # null: the rank does not look stuck, or its main thread is in no file-system call.
    blocked_io: BlockedIoReport | None = None
    # null: not read (an agent before it, a kernel without schedstat, the first sample).
    sched: SchedReport | None = None


class LauncherReport(_Strict):
    """A launcher process (torchrun's elastic agent) on this node, with or without workers."""

    pid: Annotated[Int, Field(ge=1)]
    job_id: Annotated[str, Field(max_length=256)] | None = None
    cmdline: Annotated[str, Field(max_length=4096)] = ""
    alive: bool = True
    exit: ExitReport | None = None
    state: Annotated[str, Field(max_length=2)] | None = None
    started_at: Float | None = None
    nnodes: ShortStr | None = None  # "2" or "1:4"
    nproc_per_node: ShortStr | None = None
    node_rank: Int | None = None
    master_addr: ShortStr | None = None
    master_port: Int | None = None
    worker_pids: Annotated[list[Int], Field(max_length=1024)] = []
    stack: StackReport | None = None
    sockets: Annotated[list[SocketReport], Field(max_length=256)] = []
    log_errors: Annotated[list[LineStr], Field(max_length=50)] = []


class OrphanReport(_Strict):
    """A leftover training or launcher process whose parent is gone (PPID 1)."""

    pid: Annotated[Int, Field(ge=1)]
    cmdline: Annotated[str, Field(max_length=4096)] = ""
    started_at: Float | None = None
    listening_ports: Annotated[list[Int], Field(max_length=64)] = []


class InterfaceReport(_Strict):
    name: ShortStr
    up: bool = True
    addresses: Annotated[list[ShortStr], Field(max_length=32)] = []


class CollectorHealth(_Strict):
    name: ShortStr
    ok: bool
    error: LineStr | None = None
    duration_s: Float | None = None


class HostReport(_Strict):
    hostname: ShortStr = ""
    cpu_count: Int | None = None
    # Only the flags that matter to the diagnosis (amx_bf16, avx512_bf16, ...).
    cpu_flags: Annotated[list[ShortStr], Field(max_length=64)] = []
    cpu_model: ShortStr = ""
    interfaces: Annotated[list[InterfaceReport], Field(max_length=64)] = []


class NcclRankReport(_Strict):
    """One rank of a communicator, as NCCL's RAS service saw it (a rank of the reporting node)."""

    rank: Annotated[Int, Field(ge=0)]  # in the communicator, not necessarily the job's rank
    pid: Int  # as the agent knows the process (the service's pid, out of a container's namespace)
    host: ShortStr = ""  # the address NCCL uses for this rank
    # Collectives launched so far, by type ("AllReduce", "Broadcast", ...).
    collective_counts: Annotated[dict[Annotated[str, Field(max_length=32)], Int], Field(max_length=16)] = {}
    # The communicator's asynchronous error by name ("remote error", "invalid usage"); null: none.
    async_error: ShortStr | None = None
    aborted: bool = False
    destroyed: bool = False
    finalized: bool = False


class NcclMissingRankReport(_Strict):
    """A rank of a communicator the RAS service got no data from."""

    rank: Annotated[Int, Field(ge=0)]
    pid: Int | None = None  # the process's own pid (or the agent's, when the rank is the node's)
    host: ShortStr = ""
    unresponsive: bool = False
    considered_dead: bool = False


class NcclCommReport(_Strict):
    hash: Annotated[str, Field(max_length=64)]
    size: Annotated[Int, Field(ge=1)]
    # Ranks the service had data from, over the whole communicator (``ranks`` holds this node's).
    ranks_count: Int | None = None
    ranks: Annotated[list[NcclRankReport], Field(max_length=256)] = []
    missing_ranks: Annotated[list[NcclMissingRankReport], Field(max_length=64)] = []


class NcclRasReport(_Strict):
    """The latest answer of NCCL's RAS service on the node (agent/nccl_ras.py): its communicators
    with this node's ranks in them. Every node's agent sends its own ranks; the monitor joins them."""

    polled_at: Float
    # Since when the answer has stayed the same (a hang freezes NCCL's counts).
    unchanged_since: Float | None = None
    # "ok" when NCCL answered; else why there is nothing ("no listener": no NCCL job here).
    status: ShortStr = "ok"
    address: ShortStr = ""
    nccl_version: Annotated[str, Field(max_length=64)] = ""
    communicators: Annotated[list[NcclCommReport], Field(max_length=64)] = []


class AgentInfo(_Strict):
    version: ShortStr = ""
    pid: Int | None = None
    started_at: Float | None = None
    interval_s: Float | None = None
    py_spy: LineStr | None = None  # "ok", or why stacks are unavailable
    # The agent's own use: percent of one core over its last tick (py-spy included), resident bytes.
    cpu_percent: Float | None = None
    rss_bytes: Int | None = None


class OrderResult(_Strict):
    """What became of one of the monitor's signal orders (agent/signal_orders.py, monitor/engine/actions/)."""

    id: Annotated[str, Field(min_length=1, max_length=64)]
    ok: bool
    detail: LineStr = ""


class Report(_Strict):
    schema_version: Literal[1]
    node: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")]
    sent_at: Float
    agent: AgentInfo = AgentInfo()
    # null in a delta report: unchanged since the last report.
    host: HostReport | None = HostReport()
    collectors: Annotated[list[CollectorHealth], Field(max_length=64)] = []
    ranks: Annotated[list[RankReport], Field(max_length=4096)] = []
    launchers: Annotated[list[LauncherReport], Field(max_length=256)] = []
    orphans: Annotated[list[OrphanReport], Field(max_length=256)] = []
    # null: the agent does not poll NCCL's RAS service (or, in a delta report, its answer is unchanged).
    nccl_ras: NcclRasReport | None = None
    # A delta report carries only what changed since the node's last report the monitor
    # took (agent/delta.py): a stack only when it is a new dump, only new progress points,
    # and null host/sockets, empty env/cmdline when unchanged. The monitor keeps the rest.
    # Agents send deltas only to a monitor whose answer says ``"delta": true``.
    delta: bool = False
    # A report kept by the agent while the monitor was unreachable, delivered late, oldest first
    # and always full: the monitor applies it at the time it was taken (its ``sent_at``) and
    # records the verdicts it leads to at that time (agent/outage_journal.py).
    replayed: bool = False
    # This report's number in its agent's run (1, 2, ...: monitor/ingest/report_order.py); a report whose
    # number is not above the last one taken from the node is refused as stale (a replay).
    seq: Annotated[int, Field(ge=1)] | None = None
    # The outcome of the signal orders the monitor's answers carried, once each.
    order_results: Annotated[list[OrderResult], Field(max_length=64)] = []
