"""A straggler in a job that still steps: one rank sets everybody's pace.

In synchronous training every rank waits at each collective for the slowest one, so the job
keeps stepping, just slower, and nothing stalls. What tells the slow rank is the work each rank
does per second: a rank waiting in a collective (gloo, or any CPU backend) sleeps, so over a
half-minute a rank with 30% more work per step shows 30% more CPU than its peers, whatever the
machine's load (contention stretches the steps of all ranks alike; CPU time is work, not wall
time). ``RankView.cpu_level_percent`` is that level: the median of the rank's CPU over the last
half-minute, which a short burst on one rank (a log flush, a metrics reduction) does not move.

The rule reads levels only while they mean work per step:

- the job must be past its warm-up and stepping steadily through the whole window: a stall, a
  checkpoint or an evaluation inside it puts one rank's busy stretch against the others' wait;
- no rank with GPUs: NCCL ranks spin at 100% CPU while they wait, so CPU cannot rank them (the
  GPUs' own utilisation counts the NCCL kernel's wait as busy too); their GPUs' clocks and NVML's
  reasons for holding them down can (diagnosis.gpu_clocks);
- a rank starved of CPU time (a cgroup quota, a neighbour on its core) is slow at a lower CPU level
  than the peers that wait for it: the kernel's count of the time it was denied names it
  (diagnosis.denied_cpu), and while ranks are denied unevenly CPU levels are not compared at all;
- the named ranks must stand clear of the rest (MIN_RATIO and MIN_MARGIN_PERCENT above the others'
  median, and well outside their spread) and be few (at most one rank in MAX_SHARE_DENOMINATOR):
  a pipeline's busiest stage or a job split into two halves is a shape, not a straggler.
"""

from __future__ import annotations

from statistics import median, median_low

from hangwatch_common.name_lists import nodes_text
from monitor.diagnosis.context import Context, ranks_text
from monitor.diagnosis.denied_cpu import starved_ranks, uneven
from monitor.diagnosis.gpu_clocks import throttled_gpus
from monitor.diagnosis.model import Diagnosis

# A rank's level (monitor.ingest.tracks keeps it): the median of its per-report CPU over a window
# (model.CPU_LEVEL_WINDOW_S by default, the monitor's straggler_window_s setting), worked out again
# every CPU_LEVEL_EVERY of the window once half the reports it should hold (CPU_LEVEL_MIN_SAMPLES)
# span at least CPU_LEVEL_MIN_SPAN of it. (A median of 30 values per report and rank would cost a
# 10,000-rank job 30 ms a second; a level 5 s old is fresh enough for a half-minute judgement.)
# - The window spans at least CPU_LEVEL_MIN_REPORTS of the rank's own report intervals: at one report
#   every 10 s a half-minute holds 3 or 4 samples, too few for a level, and a median that one new
#   sample moves. Past the straggler window, over which this rule checks the job's steps, such a
#   stretched window gives no level while a pause of the job lies inside it.
# - A level is not worked out again until the job has stepped since the last time: a deadlock's first
#   samples would move the levels of the ranks whose nodes reported since it, not yet the others'.
CPU_LEVEL_EVERY = 1 / 6
CPU_LEVEL_MIN_SAMPLES = 0.5
CPU_LEVEL_MIN_SPAN = 2 / 3
CPU_LEVEL_MIN_REPORTS = 8

# The slow rank does at least this much more work per second than the others' median ...
MIN_RATIO = 1.2
# ... and at least this many CPU percentage points more (low levels are mostly noise) ...
MIN_MARGIN_PERCENT = 10.0
# ... and stands this many median absolute deviations above them, and this many points clear
# of the busiest of the others (a slope of levels is a mixed fleet, not a straggler).
MIN_SPREADS = 5.0
MIN_GAP_PERCENT = 5.0
# At most one rank in this many may be named: more is the job's own shape.
MAX_SHARE_DENOMINATOR = 8
# Most live ranks must have a level (a job whose ranks just started has too few samples).
MEASURED_SHARE = 0.9
# Steady stepping: no gap in the job's progress longer than this many times its step interval
# (nor than STEADY_GAP_MIN_S) within the window.
STEADY_GAP_FACTOR = 4.0
STEADY_GAP_MIN_S = 5.0


def slow_ranks(ctx: Context) -> Diagnosis | None:
    """``straggler`` naming the ranks that set the pace of a job that still steps, or None."""
    if not _steady(ctx):
        return None
    starved = starved_ranks(ctx)
    if starved is not None or uneven(ctx):
        return starved  # a rank denied CPU does less work a second than it needs: levels do not compare
    live = ctx.live()
    if any(a.rank.gpu_utilization_percent is not None for a in live):
        return throttled_gpus(ctx)  # CPU cannot rank GPU ranks; their GPUs' clocks can
    levels = {a.rank.rank: a.rank.cpu_level_percent for a in live if a.rank.cpu_level_percent is not None}
    if len(levels) < 2 or len(levels) < MEASURED_SHARE * len(live):
        return None
    # The majority sets the bar: the ranks left when as many as may be named are put aside (with
    # two ranks, the other rank).
    most = max(1, len(levels) // MAX_SHARE_DENOMINATOR)
    majority = sorted(levels.values())[:-most]
    typical = median_low(majority)
    spread = median(abs(v - typical) for v in majority)
    bar = max(typical * MIN_RATIO, typical + MIN_MARGIN_PERCENT, typical + MIN_SPREADS * spread)
    culprits = sorted(r for r, v in levels.items() if v >= bar)
    if not culprits or len(culprits) > most:
        return None
    others = [v for r, v in levels.items() if r not in culprits]
    if min(levels[r] for r in culprits) - max(others) < MIN_GAP_PERCENT:
        return None
    return _straggler(ctx, culprits, levels, others, median(others))


def _steady(ctx: Context) -> bool:
    cadence = ctx.cadence
    if cadence.warming_up or cadence.median_interval_s is None or cadence.last_progress_at is None:
        return False
    start = ctx.now - ctx.job.cpu_level_window_s
    if any(at >= start for at, _ in ctx.job.phase_marks):
        return False
    longest = max(STEADY_GAP_MIN_S, STEADY_GAP_FACTOR * cadence.median_interval_s)
    times = _pace_source(ctx)
    if not times or times[0] > start:
        return False  # the job's progress does not reach back over the whole window
    seen = [t for t in times if t >= start]
    edges = [start, *seen, ctx.now]
    return all(b - a <= longest for a, b in zip(edges, edges[1:]))


def _pace_source(ctx: Context) -> tuple[float, ...]:
    """The progress source that saw the latest step: the job's log, else a rank's own."""
    sources = [ctx.job.job_progress_times] + [r.progress_times for r in ctx.job.ranks]
    return max((s for s in sources if s), key=lambda s: s[-1], default=())


def _straggler(ctx: Context, culprits: list[int], levels: dict[int, float], others: list[float],
               typical: float) -> Diagnosis:
    activities = ctx.activities
    worst = max(levels[r] for r in culprits)
    ratio = worst / typical if typical > 0 else float("inf")
    q1, q3 = _quartiles(others)
    n_others = len(others)
    evidence = [
        f"rank {r} on {activities[r].rank.node}: {levels[r]:.0f}% CPU (median over the last "
        f"{activities[r].rank.cpu_level_span_s or ctx.job.cpu_level_window_s:.0f}s)" for r in culprits[:8]
    ]
    if len(culprits) > 8:
        evidence.append(f"... and {len(culprits) - 8} more of {ranks_text(culprits)}")
    evidence.append(
        f"the other {n_others:,} rank{'s' if n_others != 1 else ''}: {typical:.0f}% CPU"
        + (f" (middle half {q1:.0f}-{q3:.0f}%)" if n_others >= 4 else "")
        + f": {ratio:.2f}x less work per second, the rest of the time waiting for the slow rank(s)"
    )
    shares = [activities[r].rank.collective_wait_share for r in levels if r not in culprits]
    shares = [s for s in shares if s is not None]
    slow_shares = [s for r in culprits if (s := activities[r].rank.collective_wait_share) is not None]
    if shares and slow_shares:
        evidence.append(f"stack samples waiting in a collective: {max(slow_shares):.0%} on "
                        f"{ranks_text(culprits)}, {median(shares):.0%} on the others")
    if ctx.cadence.median_interval_s is not None:
        evidence.append(f"steps still advance (progress seen every {ctx.cadence.median_interval_s:.2f}s): "
                        "the whole job runs at the slow rank's pace")
    nodes = sorted({activities[r].rank.node for r in culprits})
    peers = sorted(a.rank.rank for a in ctx.live() if a.rank.node in nodes and a.rank.rank not in culprits)
    hints = [
        f"Look at {nodes_text(nodes)}: CPU throttling (thermal or power "
        "cap), a slower CPU model, memory bandwidth taken by a neighbour, swapping; or more work on "
        f"{ranks_text(culprits)} (uneven data, sharding or rank-conditional code).",
        f"`py-spy top --pid PID` on {ranks_text(culprits)} shows where the extra time goes.",
    ]
    if peers:
        hints.append(f"Other ranks on the same node(s) ({ranks_text(peers)}) keep the usual pace: the rank's own "
                     "work or its cores, rather than the whole node, are the first suspects.")
    summary = (f"{ranks_text(culprits)} {'sets' if len(culprits) == 1 else 'set'} the job's pace: "
               f"{ratio:.2f}x the work per second of the other ranks, which wait for "
               f"{'it' if len(culprits) == 1 else 'them'} in collectives every step")
    return ctx.diagnosis("straggler", culprits, ctx.now - ctx.job.cpu_level_window_s, summary, evidence, hints)


def _quartiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
