"""The verdict: a job's rank snapshots in, one verdict with culprits, evidence and hints out.

Rules run in order and the first that applies wins: ended ranks explain
everything after them, a stopped rank explains the waits of its peers, a
process group that never formed comes next (after a node whose agent went silent,
which leaves the verdict unknown), and only then does a stall get read from where the
live ranks are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from monitor.diagnosis.activity import classify
from monitor.diagnosis.cadence import WARMUP_GRACE_S, job_cadence
from monitor.diagnosis.context import Context, progress_evidence
from monitor.diagnosis.held import HeldStall, discounted_lines, held_evidence, held_since, held_stall
from monitor.diagnosis.lifecycle import ended_ranks, stopped_ranks
from monitor.diagnosis.model import Diagnosis, JobView
from monitor.diagnosis.rendezvous import launch_failed, launcher_waiting, rendezvous
from monitor.diagnosis.silence import agents_silent, replays_arriving
from monitor.diagnosis.slow_network import slow_network, slower_than_usual
from monitor.diagnosis.slow_rank import slow_ranks
from monitor.diagnosis.stall import comm_share_text, stall
from monitor.diagnosis.verdict_catalogue import ALARMS

# Without a known pace, ranks parked this long in a collective count as stalled (at 10 s a rank
# spinning 1 s into a job that logs nothing was named after 11-12 s, past the 10 s people wait;
# at 7 s, 9 s, with no alarm on the slow-start cases: benchmarks/README.md) ...
PARKED_WITHOUT_PROGRESS_S = 7.0
# ... or, once two steps were seen, this many times the slowest interval between them (a
# job whose first steps take 12 s over a slow link is not stuck 10 s into its third), up
# to the warm-up grace. The time to the first step is not a pace: it holds imports,
# rendezvous and compilation, and a job stuck right after a slow start must still be caught.
STARTUP_FACTOR = 2.0
# A job whose log gives no pace (no progress line, or a single one such as "data exhausted at
# step 40") has a rhythm still: its ranks' CPU. Once its ranks were
# seen at work RHYTHM_SEEN_S before they parked, parked PAUSE_FACTOR times the longest pause
# any rank came back from (RHYTHM_MIN_PARKED_S at least, about a logged job's shortest stall)
# counts as stalled: a job with fast steps, whose ranks never showed a pause, is judged as
# soon as one that logs its steps, not PARKED_WITHOUT_PROGRESS_S later. RHYTHM_SEEN_S is about
# a logged job's warm-up (its first three steps read) at one report a second; at 5 s a job
# stalling 3 s into its work took 8.5 s against 5.8 s for the same job logging its steps.
RHYTHM_SEEN_S = 2.5
RHYTHM_MIN_PARKED_S = 4.0
PAUSE_FACTOR = 3.0
# How long past the stall threshold the verdict waits for fresh stacks before "stalled".
STACK_WAIT_S = 8.0

RULES: tuple[Callable[[Context], Diagnosis | None], ...] = (
    replays_arriving,
    launch_failed,
    ended_ranks,
    stopped_ranks,
    agents_silent,
    launcher_waiting,
    rendezvous,
)


def _stall_window(ctx: Context) -> tuple[bool, float | None]:
    """Whether the job is stalled and since when."""
    if ctx.cadence.last_progress_at is not None and ctx.cadence.is_stalled(ctx.now):
        return True, ctx.cadence.last_progress_at
    if (ctx.cadence.last_progress_at is not None and not ctx.cadence.warming_up
            and ctx.cadence.median_interval_s is not None):
        return False, None  # the pace is known and the steps keep it
    # No usual pace yet (no progress line, or only the first steps): a stall is the ranks in
    # collectives parked idle for a while. The others may be idle too (a deadlock) or busy (a
    # rank spinning in a loop of its own, a straggler): in synchronous training nobody steps
    # while a collective waits that long, whatever the log says, so a job without step logs,
    # or one stuck at its first step, gets the verdicts of a job that logs.
    waiting = [a for a in ctx.live() if a.waiting]
    parked = [a.rank.idle_since for a in waiting]
    if waiting and all(t is not None for t in parked):
        since = max(t for t in parked if t is not None)
        if ctx.cadence.last_progress_at is not None:
            since = max(since, ctx.cadence.last_progress_at)
        return ctx.now - since >= startup_allowance_s(ctx, since), since
    return False, None


def startup_allowance_s(ctx: Context, parked_since: float | None = None) -> float:
    """How long ranks may sit parked while the job's pace is not yet known."""
    if ctx.cadence.median_interval_s is None and parked_since is not None:  # no pace from the log
        rhythm = rhythm_allowance_s(ctx.job.working_since, ctx.job.longest_pause_s, parked_since)
        if rhythm is not None:
            return rhythm
    slowest = ctx.cadence.longest_interval_s or 0.0
    return min(WARMUP_GRACE_S, max(PARKED_WITHOUT_PROGRESS_S, STARTUP_FACTOR * slowest))


def rhythm_allowance_s(working_since: float | None, longest_pause_s: float, parked_since: float) -> float | None:
    """How long ranks of a job that logs no progress may sit parked, from the rhythm of their CPU;
    None while the job was not seen at work long enough before it parked to know its rhythm."""
    if working_since is None or parked_since - working_since < RHYTHM_SEEN_S:
        return None
    return min(PARKED_WITHOUT_PROGRESS_S, max(RHYTHM_MIN_PARKED_S, PAUSE_FACTOR * longest_pause_s))


def _still_gathering(ctx: Context, held: HeldStall | None = None) -> bool:
    """Stacks are on their way (the agent dumps ranks that look stuck): wait a little for them."""
    if ctx.job.stacks_unavailable_reason:
        return False
    if held is not None:  # stalled by the ranks' own clock, not the log's
        if held.held_s > held.allowance_s + STACK_WAIT_S:
            return False
    else:
        silent = ctx.cadence.silent_for(ctx.now)
        if silent is None or silent > ctx.cadence.stall_after_s + STACK_WAIT_S:
            return False
    # A busy rank without a fresh stack may be evaluating or saving (a phase, not a
    # hang): its first stuck-rank dump decides, so it is waited for like an unknown rank.
    return any(a.kind == "unknown" or (a.busy and not a.stack_fresh) for a in ctx.live())


def _healthy(ctx: Context) -> Diagnosis:
    silent = ctx.cadence.silent_for(ctx.now)
    if silent is None:
        summary = "running; no step completed yet"
    else:
        pace = ctx.cadence.median_interval_s
        summary = f"steps advancing (last {silent:.1f}s ago" + (f", usually seen every {pace:.2f}s)" if pace else ")")
    evidence = progress_evidence(ctx)
    share = comm_share_text(ctx)
    if share:
        summary += f"; {share}"
        evidence.append(share)
    slower = slower_than_usual(ctx)
    if slower:
        summary += f"; {slower}"
        evidence.append(slower)
    states = {a.rank.rank: "running" for a in ctx.live() if a.kind in ("computing", "unknown", "idle")}
    return ctx.diagnosis("healthy", (), None, summary, evidence, states=states)


def diagnose(job: JobView) -> Diagnosis:
    cadence = job_cadence(job)
    ctx = Context(job, cadence, {r.rank: classify(r, cadence.last_progress_at) for r in job.ranks})
    for rule in RULES:
        found = rule(ctx)
        if found is not None:
            return found
    if not job.ranks:
        if any(lv.alive for lv in job.launchers):
            return ctx.diagnosis("healthy", (), None, "launcher started; waiting for its workers")
        return ctx.diagnosis("stalled", (), None, "no rank of this job is reported any more")
    stalled, since = _stall_window(ctx)
    held = None
    if not stalled:
        # The log says the job advances, or has not been silent long for its pace: the ranks' own
        # state may say otherwise (diagnosis.held), and outranks it.
        held = held_stall(job, _held_floor(ctx))
        if held is None:
            return slow_ranks(ctx) or slow_network(ctx) or _healthy(ctx)
        ctx = _discounted(ctx, held)
        stalled, since = True, held.since
    if _still_gathering(ctx, held):
        healthy = _healthy(ctx)
        quiet = held.held_s if held is not None else ctx.cadence.silent_for(ctx.now)
        return replace(healthy, summary=f"no step for {quiet:.0f}s; taking stacks of the ranks before judging")
    found = stall(ctx, since)
    if held is None:
        return found
    extra = (held_evidence(held), *discounted_lines(job, cadence, held))
    discounted = found.verdict in ALARMS and (cadence.last_progress_at or 0.0) > held.since
    return replace(found, evidence=(*found.evidence[:1], *extra, *found.evidence[1:]),
                   progress_discounted_after=held.since if discounted else None)


def _held_floor(ctx: Context) -> float:
    """The least a rank may be held while the job's pace is still unknown (its first steps): no
    sooner than a job that logs nothing would be judged. Nothing more once the pace is known."""
    if not ctx.cadence.warming_up and ctx.cadence.median_interval_s is not None:
        return 0.0
    held = [t for t in map(held_since, ctx.job.ranks) if t is not None]
    return startup_allowance_s(ctx, min(held)) if held else 0.0


def _discounted(ctx: Context, held: HeldStall) -> Context:
    """The job as of the stall the ranks show: progress read after it does not count, so the stacks
    taken since are fresh and decide."""
    last = ctx.cadence.last_progress_at
    if last is None or last <= held.since:
        return ctx
    cadence = replace(ctx.cadence, last_progress_at=held.since)
    return Context(ctx.job, cadence, {r.rank: classify(r, held.since) for r in ctx.job.ranks})
