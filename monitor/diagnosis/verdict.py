"""The verdict: a job's rank snapshots in, one verdict with culprits, evidence and hints out.

Rules run in order and the first that applies wins: ended ranks explain
everything after them, a stopped rank explains the waits of its peers, and only
then does a stall get read from where the live ranks are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from monitor.diagnosis.activity import Activity, classify, is_stopped
from monitor.diagnosis.cadence import Cadence, job_cadence
from monitor.diagnosis.exits import describe_exit, first_causes
from monitor.diagnosis.model import Diagnosis, JobView, RankDiagnosis, WaitGroup
from monitor.diagnosis.stacks import REGULAR_COLLECTIVES

# Rendezvous normally takes a second or two; longer than this is a hang.
RENDEZVOUS_GRACE_S = 10.0
# Without any progress line, ranks parked this long in a collective count as stalled.
PARKED_WITHOUT_PROGRESS_S = 10.0


@dataclass
class _Context:
    job: JobView
    cadence: Cadence
    activities: dict[int, Activity] = field(default_factory=dict)

    @property
    def now(self) -> float:
        return self.job.now

    def live(self) -> list[Activity]:
        return [a for a in self.activities.values() if a.rank.alive]

    def missing_ranks(self) -> list[int]:
        return sorted(set(range(self.job.world_size)) - set(self.activities))

    def diagnosis(
        self,
        verdict: str,
        culprits: Iterable[int],
        since: float | None,
        summary: str,
        evidence: Iterable[str] = (),
        hints: Iterable[str] = (),
        groups: Iterable[WaitGroup] = (),
        states: dict[int, str] | None = None,
    ) -> Diagnosis:
        states = states or {}
        ranks = tuple(
            RankDiagnosis(
                rank=a.rank.rank,
                state=states.get(a.rank.rank, a.kind),
                top_frame=a.top_frame,
                wait_site=a.wait.site if a.wait else None,
            )
            for a in sorted(self.activities.values(), key=lambda a: a.rank.rank)
        )
        return Diagnosis(
            verdict=verdict,
            culprit_ranks=tuple(sorted(set(culprits))),
            since=since,
            summary=summary,
            evidence=tuple(evidence),
            hints=tuple(hints),
            ranks=ranks,
            groups=tuple(groups),
        )


def _wait_verb(ranks: Iterable[int]) -> str:
    """"rank 1 waits" / "ranks 0, 2 wait"."""
    ranks = list(ranks)
    return f"{_ranks_text(ranks)} {'waits' if len(ranks) == 1 else 'wait'}"


def _ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {', '.join(str(r) for r in ranks)}"


def _cpu_text(a: Activity) -> str:
    return "CPU unknown" if a.rank.cpu_percent is None else f"{a.rank.cpu_percent:.0f}% CPU"


def _where(a: Activity) -> str:
    if a.wait is not None:
        return a.wait.detail
    return a.top_frame or "no stack yet"


def _progress_evidence(ctx: _Context) -> list[str]:
    silent = ctx.cadence.silent_for(ctx.now)
    if silent is None:
        return ["no progress line seen yet"]
    usual = ctx.cadence.median_interval_s
    # Progress lines are timed when the agent reads them (once per interval), so this
    # is the usual gap between sightings of progress, not the step time itself.
    pace = f" (progress usually seen every {usual:.2f}s)" if usual is not None else ""
    return [f"no progress for {silent:.1f}s{pace}"]


# --- rules -----------------------------------------------------------------


def _ended_ranks(ctx: _Context) -> Diagnosis | None:
    ended = [a for a in ctx.activities.values() if not a.rank.alive]
    if not ended:
        return None
    live = ctx.live()
    any_failed = any(a.rank.exit is not None and a.rank.exit.failed for a in ended)
    if not live and not any_failed:
        last = max((a.rank.exit.at for a in ended if a.rank.exit), default=None)
        return ctx.diagnosis(
            "finished", (), last, f"all {len(ended)} ranks ended normally",
            evidence=[describe_exit(a.rank) for a in sorted(ended, key=lambda a: a.rank.rank)],
        )
    if live and not any_failed and not _live_ranks_held_up(ctx, ended, live):
        return None  # the others may still be finishing their last steps
    causes = first_causes([a.rank for a in ended])
    first_at = min(r.exit.at for r in causes if r.exit) if any(r.exit for r in causes) else None
    culprits = [r.rank for r in causes]
    evidence = [describe_exit(r) for r in sorted((a.rank for a in ended), key=lambda r: r.exit.at if r.exit else 0)]
    for a in live:
        evidence.append(f"rank {a.rank.rank} still alive: {a.kind}, {_where(a)}, {_cpu_text(a)}")
    summary = f"{_ranks_text(culprits)} ended first"
    if live:
        summary += f"; {_ranks_text(a.rank.rank for a in live)} left waiting"
    elif len(ended) > len(culprits):
        summary += "; the other ranks failed because of it"
    hints = [
        f"Look at why {_ranks_text(culprits)} ended: its own error or exit status above is the cause; "
        "'Connection closed by peer' errors on the other ranks are consequences.",
        "A rank that leaves the training loop early (uneven data per rank) ends the job: give every "
        "rank the same number of batches (DistributedSampler(drop_last=True)) or agree on stopping "
        "with an all_reduce of a 'done' flag.",
        "Signal 9 with no traceback is usually the kernel's OOM killer: check `dmesg` on that node.",
    ]
    return ctx.diagnosis("rank_exited", culprits, first_at, summary, evidence, hints)


def _live_ranks_held_up(ctx: _Context, ended: list[Activity], live: list[Activity]) -> bool:
    """Clean exits only matter when the ranks still alive stopped progressing or wait on peers."""
    if ctx.cadence.is_stalled(ctx.now):
        return True
    first_exit = min((a.rank.exit.at for a in ended if a.rank.exit), default=None)
    if first_exit is None:
        return False
    fresh = [classify(a.rank, first_exit) for a in live]
    return any(a.waiting for a in fresh) and ctx.now - first_exit > 2.0


def _stopped_ranks(ctx: _Context) -> Diagnosis | None:
    stopped = [a for a in ctx.live() if is_stopped(a.rank)]
    if not stopped:
        return None
    since = min(a.rank.state_since or a.rank.observed_at for a in stopped)
    evidence = [
        f"rank {a.rank.rank} (pid {a.rank.pid} on {a.rank.node}) is in kernel state "
        f"{a.rank.proc_state} (stopped) for {ctx.now - (a.rank.state_since or ctx.now):.0f}s"
        for a in stopped
    ]
    for a in ctx.live():
        if a not in stopped:
            evidence.append(f"rank {a.rank.rank}: {a.kind}, {_where(a)}, {_cpu_text(a)}")
    pids = " ".join(str(a.rank.pid) for a in stopped if a.rank.pid)
    hints = [
        f"Resume it with `kill -CONT {pids}` if nobody is debugging it.",
        "Look for what stopped it: job control (Ctrl-Z in the launching shell), a debugger or "
        "tracer (`grep TracerPid /proc/PID/status`), or a script sending SIGSTOP.",
    ]
    culprits = [a.rank.rank for a in stopped]
    return ctx.diagnosis(
        "rank_stopped", culprits, since, f"{_ranks_text(culprits)} stopped; the others wait for it",
        evidence, hints,
    )


def _rendezvous(ctx: _Context) -> Diagnosis | None:
    waiting = [
        a for a in ctx.live()
        if a.kind == "rendezvous" and ctx.now - a.rank.first_seen_at >= RENDEZVOUS_GRACE_S
    ]
    if not waiting:
        return None
    missing = ctx.missing_ranks()
    present = sorted(ctx.activities)
    evidence = [
        f"{len(present)} of world size {ctx.job.world_size} ranks seen: {_ranks_text(present)}",
    ]
    evidence += [
        f"rank {a.rank.rank} on {a.rank.node} in {_where(a)} for "
        f"{ctx.now - a.rank.first_seen_at:.0f}s, {_cpu_text(a)}"
        for a in waiting
    ]
    if missing:
        summary = (
            f"process group never formed: world size {ctx.job.world_size} not reached, "
            f"waiting for {_ranks_text(missing)}"
        )
    else:
        summary = "process group never formed: every rank is present but initialisation does not complete"
    hints = [
        "Check that every node started its launcher with the same --nnodes/--nproc-per-node, "
        "MASTER_ADDR and MASTER_PORT, and that the missing ranks' nodes can reach MASTER_ADDR:MASTER_PORT.",
        "Gloo also needs connections between every pair of ranks on ephemeral ports: open them in the "
        "firewall (or set GLOO_PORT_RANGE and open that range) and set GLOO_SOCKET_IFNAME to the NIC "
        "that joins the nodes.",
    ]
    since = min(a.rank.first_seen_at for a in waiting)
    return ctx.diagnosis("rendezvous_hang", missing, since, summary, evidence, hints)


def _group_waits(waiting: list[Activity]) -> list[WaitGroup]:
    by_site: dict[str, list[int]] = defaultdict(list)
    for a in waiting:
        assert a.wait is not None
        by_site[a.wait.site].append(a.rank.rank)
    return [WaitGroup(site, tuple(sorted(ranks))) for site, ranks in by_site.items()]


def _main_group(groups: list[WaitGroup], known_sites: frozenset[str]) -> WaitGroup:
    """The place most ranks wait; ties go to the job's regular sync point."""

    def key(g: WaitGroup) -> tuple[int, bool, bool, str]:
        kind = g.site.split("@", 1)[0]
        return (len(g.ranks), g.site in known_sites, kind in REGULAR_COLLECTIVES, g.site)

    return max(groups, key=key)


def _stall(ctx: _Context, since: float | None) -> Diagnosis:
    live = ctx.live()
    waiting = [a for a in live if a.waiting]
    busy = [a for a in live if a.kind == "computing"]
    idle = [a for a in live if a.kind == "idle"]
    unknown = [a for a in live if a.kind == "unknown"]
    evidence = _progress_evidence(ctx)
    evidence += [f"rank {a.rank.rank} on {a.rank.node}: {a.kind}, {_where(a)}, {_cpu_text(a)}" for a in live]

    if waiting and busy:
        culprits = [a.rank.rank for a in busy]
        doing = "; ".join(f"rank {a.rank.rank}: {a.top_frame or 'busy'}" for a in busy)
        return ctx.diagnosis(
            "straggler", culprits, since,
            f"{_ranks_text(culprits)} still computing while {_wait_verb(a.rank.rank for a in waiting)} "
            f"in {waiting[0].wait.kind if waiting[0].wait else 'a collective'}",
            evidence + [f"busy: {doing}"],
            [
                f"Find out what keeps {_ranks_text(culprits)} busy (its top frame above): uneven work per "
                "rank, slow data loading, checkpoint writing, swapping, or a slower or overloaded node.",
                "If this is expected (a rank-0 checkpoint or evaluation), it ends by itself; otherwise "
                "`py-spy dump --native --pid PID` on the busy rank shows where it spends its time.",
            ],
        )
    if busy and not waiting and not idle:
        return ctx.diagnosis(
            "slow_compute", (), since,
            "every rank is computing, none waits on another, but steps do not complete in the usual time",
            evidence + _compute_evidence(ctx, busy),
            _compute_hints(ctx),
        )
    if waiting and any(a.kind == "sending" for a in waiting):
        return ctx.diagnosis(
            "stalled", (), since,
            "no progress, but ranks in collectives are still sending data: slow communication, not a deadlock",
            evidence,
            ["Check the links between nodes (bandwidth, packet loss); set GLOO_SOCKET_IFNAME to the fast NIC."],
        )
    if waiting and not busy and not unknown:
        return _deadlock(ctx, since, waiting, idle, evidence)
    if unknown and ctx.job.stacks_unavailable_reason:
        evidence.append(f"no stacks: {ctx.job.stacks_unavailable_reason}")
    return ctx.diagnosis(
        "stalled", (), since, "no progress, and the ranks' positions do not match a known hang (yet)",
        evidence,
        ["Run `py-spy dump --pid PID` on each rank; stacks are needed to tell a deadlock from a stall."],
    )


def _deadlock(
    ctx: _Context, since: float | None, waiting: list[Activity], idle: list[Activity], evidence: list[str]
) -> Diagnosis:
    groups = _group_waits(waiting)
    main = _main_group(groups, ctx.job.known_wait_sites)
    odd_groups = [g for g in groups if g is not main]
    culprits = [r for g in odd_groups for r in g.ranks] + [a.rank.rank for a in idle]
    missing = ctx.missing_ranks()
    if not culprits:
        culprits = missing
    group_lines = [f"{_wait_verb(g.ranks)} in {g.site}" for g in sorted(groups, key=lambda g: g.ranks)]
    main_kind = main.site.split("@", 1)[0]
    parts = []
    if idle:
        parts.append(
            f"{_ranks_text(a.rank.rank for a in idle)} never reached it "
            f"(at {'; '.join(a.top_frame or '?' for a in idle)})"
        )
    if odd_groups:
        parts.append("; ".join(f"{_wait_verb(g.ranks)} in a different collective, {g.site}" for g in odd_groups))
    if not parts and missing:
        parts.append(f"{_ranks_text(missing)} not seen by any agent")
    if not parts:
        parts.append("every rank waits at the same place: no rank is missing from it")
    summary = f"{_wait_verb(main.ranks)} in {main_kind} ({main.site}); " + "; ".join(parts)
    hints = [
        "Every rank must run the same collectives in the same order: look for rank-conditional code "
        "(rank-0-only checkpointing or logging that calls a collective) and uneven data per rank.",
    ]
    if idle:
        hints.append(
            f"{_ranks_text(a.rank.rank for a in idle)} left the training loop while alive: give every rank "
            "the same number of batches, or agree on stopping with an all_reduce of a 'done' flag."
        )
    if not odd_groups and not idle:
        hints.append(
            "With every rank in the same collective, suspect the network (a peer unreachable) or "
            "collectives whose tensor sizes differ between ranks."
        )
    cpu = [a.rank.cpu_percent for a in waiting if a.rank.cpu_percent is not None]
    if cpu:
        evidence.append(f"CPU of waiting ranks: max {max(cpu):.0f}%; bytes written: none moving")
    return ctx.diagnosis("deadlock", culprits, since, summary, evidence + group_lines, hints, groups)


def _compute_evidence(ctx: _Context, busy: list[Activity]) -> list[str]:
    nodes = {a.rank.node for a in busy}
    lines = []
    for node in sorted(nodes):
        facts = ctx.job.hosts.get(node)
        if facts is not None:
            bf16 = sorted(facts.cpu_flags & {"amx_bf16", "avx512_bf16"})
            lines.append(f"{node}: CPU bf16 support: {', '.join(bf16) if bf16 else 'none (no amx_bf16/avx512_bf16)'}")
    return lines


def _compute_hints(ctx: _Context) -> list[str]:
    return [
        "The ranks are busy, not stuck: compare the step time with earlier runs; check thread "
        "oversubscription (OMP_NUM_THREADS × ranks per node ≤ cores).",
        "bfloat16 on a CPU without amx_bf16/avx512_bf16 is many times slower than float32: train in "
        "float32 there.",
    ]


def _stall_window(ctx: _Context) -> tuple[bool, float | None]:
    """Whether the job is stalled and since when."""
    if ctx.cadence.last_progress_at is not None:
        return ctx.cadence.is_stalled(ctx.now), ctx.cadence.last_progress_at
    # No progress line ever: a stall is every live rank idle for a while, at least
    # one of them parked in a collective (a job without step logs still deadlocks).
    live = ctx.live()
    idle_since = [a.rank.idle_since for a in live]
    if live and any(a.waiting for a in live) and all(t is not None for t in idle_since):
        since = max(t for t in idle_since if t is not None)
        return ctx.now - since >= PARKED_WITHOUT_PROGRESS_S, since
    return False, None


def _healthy(ctx: _Context) -> Diagnosis:
    silent = ctx.cadence.silent_for(ctx.now)
    if silent is None:
        summary = "running; no step completed yet"
    else:
        pace = ctx.cadence.median_interval_s
        summary = f"steps advancing (last {silent:.1f}s ago" + (f", usually seen every {pace:.2f}s)" if pace else ")")
    states = {a.rank.rank: "running" for a in ctx.live() if a.kind in ("computing", "unknown", "idle")}
    return ctx.diagnosis("healthy", (), None, summary, _progress_evidence(ctx), states=states)


RULES: tuple[Callable[[_Context], Diagnosis | None], ...] = (_ended_ranks, _stopped_ranks, _rendezvous)


def diagnose(job: JobView) -> Diagnosis:
    cadence = job_cadence(job)
    fresh_after = cadence.last_progress_at
    ctx = _Context(job, cadence, {r.rank: classify(r, fresh_after) for r in job.ranks})
    if not job.ranks:
        return ctx.diagnosis("stalled", (), None, "no rank of this job is reported any more")
    for rule in RULES:
        found = rule(ctx)
        if found is not None:
            return found
    stalled, since = _stall_window(ctx)
    if not stalled:
        return _healthy(ctx)
    return _stall(ctx, since)
