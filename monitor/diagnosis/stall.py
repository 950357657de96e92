"""Rules for a job whose live ranks stopped progressing: where they are decides the verdict."""

from __future__ import annotations

from collections import defaultdict

from hangwatch_common.name_lists import nodes_text
from monitor.diagnosis.activity import BUSY_CPU_PERCENT, Activity
from monitor.diagnosis.context import Context, describe_all, progress_evidence, ranks_text, wait_verb
from monitor.diagnosis.flight_recorder import with_flight_recorder
from monitor.diagnosis.held import phase_void, stuck_in_io, stuck_io_text
from monitor.diagnosis.model import Diagnosis, WaitGroup
from monitor.diagnosis.nccl import with_nccl
from monitor.diagnosis.phases import fresh_log_phase, phase_grace_s
from monitor.diagnosis.slow_network import slow_communication
from monitor.diagnosis.stacks import REGULAR_COLLECTIVES

BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
# One rank's progress stopping this much before the others' marks it as first to stop.
FIRST_TO_STOP_MARGIN_S = 1.0
COMM_BOUND_SHARE = 0.5


# Where the stacks cannot tell the ranks apart. NCCL's counts can (diagnosis.nccl), and then
# this guess gives way to them.
SAME_COLLECTIVE_HINT = ("With every rank in the same collective, suspect the network (a peer unreachable) or "
                        "collectives whose tensor sizes differ between ranks.")


def _group_waits(waiting: list[Activity]) -> list[WaitGroup]:
    by_site: dict[str, list[int]] = defaultdict(list)
    for a in waiting:
        if a.wait is not None:
            by_site[a.wait.site].append(a.rank.rank)
    return [WaitGroup(site, tuple(sorted(ranks))) for site, ranks in by_site.items()]


def _main_group(groups: list[WaitGroup], known_sites: frozenset[str]) -> WaitGroup:
    """The place most ranks wait; ties go to the job's regular sync point."""

    def key(g: WaitGroup) -> tuple[int, bool, bool, str]:
        kind = g.site.split("@", 1)[0]
        return (len(g.ranks), g.site in known_sites, kind in REGULAR_COLLECTIVES, g.site)

    return max(groups, key=key)


def _doing(a: Activity) -> str:
    phase = a.phase
    what = {"checkpoint": "writing a checkpoint", "evaluation": "evaluating", "compilation": "compiling"}.get(
        phase or "", "writing (I/O)" if a.kind == "writing" else "computing"
    )
    rate = a.rank.write_bytes_per_s
    written = f", writing {rate / 1e6:.1f} MB/s" if rate and rate >= 1e5 else ""
    where = f"in {a.top_frame}" if a.top_frame else ("(says its log)" if phase else "in an unknown frame")
    return f"rank {a.rank.rank} {what} {where}{written}"


def _bf16_findings(ctx: Context, busy: list[Activity]) -> tuple[list[str], list[str]]:
    evidence: list[str] = []
    hints: list[str] = []
    dtype_lines = {a.rank.compute_dtype_line or a.rank.compute_dtype for a in busy
                   if a.rank.compute_dtype and "bfloat16" in a.rank.compute_dtype}
    kernels = {f.name[:80] for a in busy if a.rank.stack for f in a.rank.stack.frames
               if f.native and ("BFloat16" in f.name or "bf16" in f.name.lower())}
    if not dtype_lines and not kernels:
        return evidence, hints
    evidence += [f"the log announces bfloat16 compute: {line}" for line in sorted(d for d in dtype_lines if d)]
    if kernels:
        evidence.append(f"bf16 kernels in native frames: {', '.join(sorted(kernels)[:3])}")
    # Nodes alike (the same CPU model and bf16 flags) share a line: a giant job has a few kinds of node.
    kinds: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for node in sorted({a.rank.node for a in busy}):
        facts = ctx.job.hosts.get(node)
        if facts is not None:
            kinds.setdefault((facts.cpu_model or "", tuple(sorted(facts.cpu_flags & BF16_FLAGS))), []).append(node)
    slow_nodes = []
    for (cpu_model, flags), nodes in kinds.items():
        model = f" ({cpu_model})" if cpu_model else ""
        if flags:
            evidence.append(f"{nodes_text(nodes)}{model} has {', '.join(flags)}: bf16 should run at full speed there")
        else:
            evidence.append(f"{nodes_text(nodes)}{model} has neither amx_bf16 nor avx512_bf16: bf16 is emulated, "
                            "many times slower")
            slow_nodes += nodes
    if slow_nodes:
        hints.append(
            f"Train in float32 on {nodes_text(slow_nodes)}: its CPU has no native bf16. If the dtype was "
            "auto-detected from a GPU that this CPU run does not use (torch.cuda.is_available()), choose it "
            "from the device the run uses instead (your training script's dtype option or autocast setting)."
        )
    return evidence, hints


def _first_to_stop(ctx: Context, ranks: list[int]) -> list[int]:
    last = {a.rank.rank: a.rank.progress_times[-1] for a in ctx.live()
            if a.rank.rank in ranks and a.rank.progress_times}
    if len(last) < 2:
        return []
    earliest = min(last.values())
    if sorted(last.values())[1] - earliest < FIRST_TO_STOP_MARGIN_S:
        return []
    return [r for r, t in last.items() if t == earliest]


def _deadlock(ctx: Context, since: float | None, waiting: list[Activity], idle: list[Activity],
              evidence: list[str]) -> Diagnosis:
    groups = _group_waits(waiting)
    main = _main_group(groups, ctx.job.known_wait_sites)
    odd_groups = [g for g in groups if g is not main]
    culprits = [r for g in odd_groups for r in g.ranks] + [a.rank.rank for a in idle]
    missing = ctx.missing_ranks()
    main_kind = main.site.split("@", 1)[0]
    parts = []
    stuck_io = [a for a in idle if stuck_in_io(a, ctx.now)]
    if idle:
        parts.append(f"{ranks_text(a.rank.rank for a in idle)} never reached it "
                     f"(at {'; '.join(a.top_frame or '?' for a in idle)})")
    if stuck_io:
        parts.insert(0, "; ".join(_stuck_io_summary(a) for a in stuck_io))
        evidence = [*evidence, *(stuck_io_text(a, ctx.now) for a in stuck_io)]
    if odd_groups:
        parts.append("; ".join(f"{wait_verb(g.ranks)} in a different collective, {g.site}" for g in odd_groups))
    if not culprits:
        if missing:
            culprits = missing
            parts.append(f"{ranks_text(missing)} not seen by any agent")
        else:
            first = _first_to_stop(ctx, list(main.ranks))
            parts.append("every rank waits at the same place (all stacks identical)")
            if first:
                culprits = first
                parts.append(f"{ranks_text(first)} stopped progressing first")
    summary = f"{wait_verb(main.ranks)} in {main_kind} ({main.site}); " + "; ".join(parts)
    hints = [
        "Every rank must run the same collectives in the same order: look for rank-conditional code "
        "(rank-0-only checkpointing or logging that calls a collective) and uneven data per rank.",
    ]
    if stuck_io:
        hints.insert(0, f"{ranks_text(a.rank.rank for a in stuck_io)} waits on a file that does not answer: check "
                     "the filesystem that holds it (a hung NFS/Lustre/FUSE mount, a full or failed disk, a "
                     "FIFO), e.g. `cat /proc/PID/stack` and `stat` on the path; save with a timeout, or to local "
                     "disk first.")
    elif idle:
        hints.append(f"{ranks_text(a.rank.rank for a in idle)} left the training loop while alive: give every "
                     "rank the same number of batches, or agree on stopping with an all_reduce of a 'done' flag.")
    if odd_groups:
        hints.append("Open the odd call site(s) above: that collective runs on some ranks only.")
    if not odd_groups and not idle:
        hints.append(SAME_COLLECTIVE_HINT)
    cpu = [a.rank.cpu_percent for a in waiting if a.rank.cpu_percent is not None]
    if cpu:
        evidence.append(f"CPU of waiting ranks: max {max(cpu):.0f}%; bytes written: none moving")
    group_lines = [f"{wait_verb(g.ranks)} in {g.site}" for g in sorted(groups, key=lambda g: g.ranks)]
    return ctx.diagnosis("deadlock", culprits, since, summary, evidence + group_lines, hints, groups)


def _all_idle(ctx: Context, since: float | None, idle: list[Activity], evidence: list[str]) -> Diagnosis:
    """No rank in a collective, none at work: the training loop runs nowhere. Ranks stuck in I/O are
    named (a load or save on a mount that does not answer); else where they sit is the evidence."""
    stuck = [a for a in idle if stuck_in_io(a, ctx.now)]
    places = "; ".join(sorted({a.top_frame or "?" for a in idle}))
    if stuck:
        return ctx.diagnosis(
            "stalled", [a.rank.rank for a in stuck], since,
            "; ".join(_stuck_io_summary(a) for a in stuck) + f"; no rank is in a collective or at work (at {places})",
            [*evidence, *(stuck_io_text(a, ctx.now) for a in stuck)],
            [f"{ranks_text(a.rank.rank for a in stuck)} waits on files that do not answer: check the filesystem "
             "that holds them (a hung NFS/Lustre/FUSE mount, an object store's FUSE layer, a failed disk), e.g. "
             "`cat /proc/PID/stack` and `stat` on the path."],
        )
    return ctx.diagnosis(
        "stalled", (), since,
        f"every rank sits idle outside any collective (at {places}): the training loop runs on no rank",
        evidence,
        ["Look at what the ranks wait for above: a DataLoader whose workers died or hang (queue.get), a lock, "
         "a sleep; `py-spy dump --pid PID` on a rank shows its other threads."],
    )


def _stuck_io_summary(a: Activity) -> str:
    blocked = a.rank.blocked_io
    on = f" ({blocked.syscall} {blocked.path or '?'})" if blocked is not None else ""
    return f"rank {a.rank.rank} is stuck in I/O{on}"


def _in_phase(ctx: Context, working: list[Activity], since: float | None) -> str | None:
    """The phase the ranks not waiting on peers are in, while it is within its grace: timed from
    the last progress, or, in a job that logs none, from when its waiting ranks parked."""
    silent = ctx.cadence.silent_for(ctx.now)
    if silent is None and since is not None:
        silent = max(0.0, ctx.now - since)
    if silent is None:
        return None
    for phase in sorted({a.phase for a in working if a.phase is not None}):
        grace = phase_grace_s(phase, ctx.cadence.phase_longest(phase))
        if silent <= max(grace, ctx.cadence.stall_after_s):
            return phase
    return None


def _phase_pace(ctx: Context, phase: str) -> str:
    longest = ctx.cadence.phase_longest(phase)
    grace = phase_grace_s(phase, longest)
    if longest is None:
        return (f"A first {phase} phase may take up to {grace:.0f}s before it counts as a stall; "
                "later ones are timed against the longest seen.")
    return (f"Earlier {phase} phases of this job took up to {longest:.0f}s; this one counts as a stall "
            f"after {grace:.0f}s.")


def stall(ctx: Context, since: float | None) -> Diagnosis:
    # NCCL's counts name the rank that diverged when every stack looks the same; so do Flight
    # Recorder's dumps, when the job writes them (the rank that stopped issuing collectives).
    result = with_nccl(ctx.job, _stall(ctx, since), since, superseded=(SAME_COLLECTIVE_HINT,))
    return with_flight_recorder(ctx.job, result, since, superseded=(SAME_COLLECTIVE_HINT,))


def busy_since_stall(a: Activity, since: float | None) -> bool:
    """Whether a computing rank's CPU reading shows it at work after the stall began. The agent
    measures CPU over the interval since its report before: at one report every 10 s, the reading of
    a rank whose node has not reported since the fault is mostly of the time before it, and would
    name it a straggler among ranks already parked. Taken as fully busy before ``since``, the reading
    must still show BUSY_CPU_PERCENT after it; one wholly from before says nothing yet."""
    rank = a.rank
    began, cpu = rank.cpu_since, rank.cpu_percent
    if a.kind != "computing" or since is None or began is None or began >= since or cpu is None:
        return True
    after = rank.observed_at - since
    if after <= 0:
        return False
    work_after = cpu / 100 * (rank.observed_at - began) - (since - began)
    return work_after >= after * BUSY_CPU_PERCENT / 100


def _stall(ctx: Context, since: float | None) -> Diagnosis:
    live = ctx.live()
    waiting = [a for a in live if a.waiting]
    busy, unknown = [], []
    for a in live:
        if a.kind == "unknown":
            unknown.append(a)
        elif a.busy:
            # A reading from before the stall is no evidence of work now: unknown until the next report.
            (busy if busy_since_stall(a, since) else unknown).append(a)
    idle = [a for a in live if a.kind == "idle"]
    evidence = progress_evidence(ctx) + describe_all(live)

    # Ranks that finished an evaluation or wait for a rank-0 checkpoint are expected to
    # wait; while the others are in such a phase (and CPU-starved ranks may look idle),
    # it is not a hang until the phase outlasts its grace.
    # A rank held at idle CPU with nothing written for STUCK_IO_S is not saving, whatever its frames
    # say (diagnosis.held): its phase excuses nothing.
    working = [a for a in live if not a.waiting and not phase_void(a, ctx.now)]
    phase = _in_phase(ctx, working, since) if working else None
    if phase is not None:
        doing = "; ".join(_doing(a) for a in working if a.phase)
        logged = [(a.rank.rank, fresh_log_phase(a.rank.log_phase, ctx.cadence.last_progress_at)) for a in working]
        evidence += [f"rank {r}'s log since its last step: {p.line}" for r, p in logged if p is not None][:4]
        silent = ctx.cadence.silent_for(ctx.now)
        quiet = f"no step for {silent:.0f}s" if silent is not None else (
            f"ranks waiting for {ctx.now - since:.0f}s" if since is not None else "no step")
        return ctx.diagnosis(
            "healthy", (), None,
            f"{quiet}, but the job is in "
            f"{'an' if phase[0] in 'aeiou' else 'a'} {phase} phase: {doing}",
            evidence,
            [_phase_pace(ctx, phase)],
        )
    if waiting and busy:
        culprits = [a.rank.rank for a in busy]
        return ctx.diagnosis(
            "straggler", culprits, since,
            f"{ranks_text(culprits)} still busy while {wait_verb(a.rank.rank for a in waiting)} in "
            f"{waiting[0].wait.kind if waiting[0].wait else 'a collective'}",
            evidence + [f"busy: {_doing(a)}" for a in busy],
            [
                f"Find out what keeps {ranks_text(culprits)} busy (above): uneven work per rank, slow data "
                "loading, checkpoint writing, swapping, or a slower or overloaded node.",
                "If this is expected (a rank-0 checkpoint or evaluation), it ends by itself; otherwise "
                "`py-spy dump --native --pid PID` on the busy rank shows where it spends its time.",
            ],
        )
    if busy and not waiting and not idle:
        bf16_evidence, bf16_hints = _bf16_findings(ctx, busy)
        return ctx.diagnosis(
            "slow_compute", (), since,
            "every rank is busy, none waits on another, but steps do not complete in the usual time",
            evidence + bf16_evidence,
            bf16_hints + [
                "The ranks are busy, not stuck: compare the step time with earlier runs; check thread "
                "oversubscription (OMP_NUM_THREADS × ranks per node ≤ cores).",
            ],
        )
    if waiting and any(a.kind == "sending" for a in waiting):
        # Bytes still move: the network carries the step slowly; nothing is hung.
        return slow_communication(ctx, since, evidence)
    if waiting and not unknown:
        return _deadlock(ctx, since, waiting, idle, evidence)
    if idle and not waiting and not busy and not unknown:
        return _all_idle(ctx, since, idle, evidence)
    if unknown and ctx.job.stacks_unavailable_reason:
        evidence.append(f"no stacks: {ctx.job.stacks_unavailable_reason}")
    return ctx.diagnosis(
        "stalled", (), since, "no progress, and the ranks' positions do not match a known hang (yet)",
        evidence,
        ["Run `py-spy dump --pid PID` on each rank; stacks are needed to tell a deadlock from a stall."],
    )


def comm_share_text(ctx: Context) -> str | None:
    shares = [a.rank.collective_wait_share for a in ctx.live() if a.rank.collective_wait_share is not None]
    if not shares:
        return None
    share = sum(shares) / len(shares)
    text = f"ranks wait in collectives in {share:.0%} of stack samples"
    if share >= COMM_BOUND_SHARE:
        text += " (communication-bound: the links between ranks set the pace)"
    return text
