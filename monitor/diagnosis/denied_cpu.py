"""A straggler made by its node, not its work: a rank denied the CPU it needs.

The CPU-level rule (diagnosis.slow_rank) compares the work each rank does per second, which holds
only while every rank gets the CPU it asks for. A rank squeezed onto a core beside busy neighbours,
or capped by its cgroup's quota, does less work per second than its peers while it sets their pace:
its own CPU sinks, theirs shows the wait for it. What the kernel counts names it: the time its main
thread sat runnable in a run queue waiting for a core (/proc/PID/schedstat), and the time its cgroup
was throttled (cpu.stat). ``RankView.run_queue_wait_level_percent`` and ``cpu_throttled_level_percent``
are those over the straggler window, as medians like the CPU level, so a burst does not move them.
"""

from __future__ import annotations

from statistics import median, median_low

from hangwatch_common.name_lists import nodes_text
from monitor.diagnosis.context import Context, ranks_text
from monitor.diagnosis.model import Diagnosis, RankView

# A starved rank is denied at least this share of the time (a quarter: one core shared four ways
# leaves each three quarters of it in the run queue) ...
MIN_DENIED_PERCENT = 25.0
# ... at least this many times the others' median and this many points above it (on a busy 2-core
# machine the peers of a rank squeezed four to a core wait 20-30% themselves, it 50-55%) ...
MIN_RATIO = 1.5
MIN_MARGIN_PERCENT = 15.0
# ... while the job runs this much slower than its best: denial that costs the job nothing (a slow
# start, a node busy alike from the first step) is no straggler.
MIN_PACE_RATIO = 1.5
# Ranks denied CPU this unevenly have CPU levels that do not measure their work.
UNEVEN_PERCENT = 20.0
# At most one rank in this many may be named (as for CPU levels): more is the node's load.
MAX_SHARE_DENOMINATOR = 8
MEASURED_SHARE = 0.9


def denied_percent(rank: RankView) -> float | None:
    """The share of the time the rank could not run: waiting for a core, or throttled by its quota."""
    parts = [p for p in (rank.run_queue_wait_level_percent, rank.cpu_throttled_level_percent) if p is not None]
    return sum(parts) if parts else None


def uneven(ctx: Context) -> bool:
    """Some ranks are denied CPU far more than others: their CPU levels do not measure their work."""
    levels = [d for a in ctx.live() if (d := denied_percent(a.rank)) is not None]
    return bool(levels) and max(levels) - min(levels) >= UNEVEN_PERCENT


def starved_ranks(ctx: Context) -> Diagnosis | None:
    """``straggler`` naming the few ranks denied CPU far more than their peers, or None. The caller
    checked that the job steps steadily through the window."""
    pace = ctx.job.pace
    if pace is None or pace.ratio < MIN_PACE_RATIO:
        return None
    live = ctx.live()
    levels = {a.rank.rank: d for a in live if (d := denied_percent(a.rank)) is not None}
    if len(levels) < 2 or len(levels) < MEASURED_SHARE * len(live):
        return None
    most = max(1, len(levels) // MAX_SHARE_DENOMINATOR)
    typical = median_low(sorted(levels.values())[:-most])
    bar = max(MIN_DENIED_PERCENT, MIN_RATIO * typical, typical + MIN_MARGIN_PERCENT)
    culprits = sorted(r for r, v in levels.items() if v >= bar)
    if not culprits or len(culprits) > most:
        return None
    return _straggler(ctx, culprits, levels, median(v for r, v in levels.items() if r not in culprits))


def _straggler(ctx: Context, culprits: list[int], levels: dict[int, float], typical: float) -> Diagnosis:
    window = ctx.job.cpu_level_window_s
    evidence = []
    for r in culprits[:8]:
        rank = ctx.activities[r].rank
        parts = []
        if rank.run_queue_wait_level_percent is not None:
            parts.append(f"waited in the run queue for a CPU {rank.run_queue_wait_level_percent:.0f}% of the time")
        if rank.cpu_throttled_level_percent:
            cgroup = f" {rank.cgroup}" if rank.cgroup else ""
            parts.append(f"its cgroup{cgroup} was throttled by its CPU quota {rank.cpu_throttled_level_percent:.0f}% "
                         "of the time")
        cpu = f", using {rank.cpu_level_percent:.0f}% CPU" if rank.cpu_level_percent is not None else ""
        evidence.append(f"rank {r} on {rank.node}: {' and '.join(parts)}{cpu} (medians over the last {window:.0f}s)")
    others = len(levels) - len(culprits)
    evidence.append(f"the other {others:,} rank{'s' if others != 1 else ''}: denied a CPU {typical:.0f}% of the "
                    "time; they wait in collectives for the starved rank(s)")
    if ctx.cadence.median_interval_s is not None:
        evidence.append(f"steps still advance (progress seen every {ctx.cadence.median_interval_s:.2f}s): "
                        "the whole job runs at the starved rank's pace")
    pace = ctx.job.pace
    if pace is not None and pace.ratio > 1.1:
        evidence.append(f"the job runs at 1/{pace.ratio:.1f} of its best pace "
                        f"({pace.now_s:.2f}s against {pace.baseline_s:.2f}s per progress line)")
    nodes = sorted({ctx.activities[r].rank.node for r in culprits})
    hints = [
        f"Look at what shares the cores of {ranks_text(culprits)} on {nodes_text(nodes)}: "
        "`ps -eLo pid,tid,psr,pcpu,comm --sort=-pcpu | head`, its affinity (`taskset -p PID`), other jobs "
        "or daemons scheduled there.",
        "A CPU quota (cgroup cpu.max, or cpu.cfs_quota_us) below what the rank's threads use throttles it: "
        "raise the quota or lower its threads (OMP_NUM_THREADS).",
    ]
    summary = (f"{ranks_text(culprits)} {'is' if len(culprits) == 1 else 'are'} starved of CPU and "
               f"{'sets' if len(culprits) == 1 else 'set'} the job's pace: denied a CPU "
               f"{max(levels[r] for r in culprits):.0f}% of the time, the other ranks {typical:.0f}%")
    return ctx.diagnosis("straggler", culprits, ctx.now - window, summary, evidence, hints)
