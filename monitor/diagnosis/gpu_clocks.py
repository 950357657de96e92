"""A straggler made by its GPU: one whose clocks are held down (heat, power, a hardware slowdown) while its
peers run at full speed.

On GPU ranks CPU cannot rank the work (NCCL's waits spin at 100%), and utilisation counts the wait
for the slow peer as busy. NVML says what slows a GPU: its SM clock against its peers', and the
reasons it gives for holding the clocks down (``nvmlDeviceGetCurrentClocksEventReasons``). A rank whose
GPU runs well below its peers' clock for one of the reasons that slow work is the pace-setter of a job
that steps. Reasons that do not slow work (idle, an application clock setting, sync boost) are not
counted.
"""

from __future__ import annotations

from statistics import median_low

from hangwatch_common.name_lists import nodes_text
from monitor.diagnosis.context import Context, ranks_text
from monitor.diagnosis.model import Diagnosis

# NVML's clock-event reasons that slow a busy GPU (the agent sends them by these names).
SLOWDOWN_REASONS = frozenset({
    "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
})
# A throttled GPU runs at most this share of its peers' median SM clock ...
MAX_CLOCK_SHARE = 0.85
# ... and the rest stand clear: at most one rank in this many may be named, and most ranks must
# report a clock.
MAX_SHARE_DENOMINATOR = 8
MEASURED_SHARE = 0.9
REASON_WORDS = {
    "sw_power_cap": "power cap",
    "hw_slowdown": "hardware slowdown",
    "sw_thermal_slowdown": "thermal slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "power brake",
}


def throttled_gpus(ctx: Context) -> Diagnosis | None:
    """``straggler`` naming the few GPU ranks held down for a reason that slows work while their peers are
    not, or None. The caller checked that the job steps steadily."""
    live = ctx.live()
    clocks = {a.rank.rank: a.rank.gpu_sm_clock_mhz for a in live if a.rank.gpu_sm_clock_mhz is not None}
    if len(clocks) < 2 or len(clocks) < MEASURED_SHARE * len(live):
        return None
    most = max(1, len(clocks) // MAX_SHARE_DENOMINATOR)
    typical = median_low(sorted(clocks.values())[most:])  # the peers, the slowest few put aside
    culprits = sorted(r for r, mhz in clocks.items()
                      if mhz <= MAX_CLOCK_SHARE * typical and ctx.activities[r].rank.gpu_slowdown_reasons)
    if not culprits or len(culprits) > most:
        return None
    peers_held = [a for a in live if a.rank.rank not in culprits and a.rank.gpu_slowdown_reasons]
    if len(peers_held) > len(live) // 2:
        return None  # most GPUs held down alike: the room's cooling or a power cap, not one rank
    evidence = []
    for r in culprits[:8]:
        rank = ctx.activities[r].rank
        why = ", ".join(REASON_WORDS.get(x, x) for x in rank.gpu_slowdown_reasons)
        top = f" of {rank.gpu_max_sm_clock_mhz} MHz" if rank.gpu_max_sm_clock_mhz else ""
        evidence.append(f"rank {r} on {rank.node}: its GPU at {clocks[r]} MHz{top}, held down by NVML's {why}")
    others = len(clocks) - len(culprits)
    evidence.append(f"the other {others:,} rank{'s' if others != 1 else ''}' GPUs: {typical} MHz (median)")
    if ctx.cadence.median_interval_s is not None:
        evidence.append(f"steps still advance (progress seen every {ctx.cadence.median_interval_s:.2f}s): "
                        "the whole job runs at the slow GPU's pace")
    nodes = sorted({ctx.activities[r].rank.node for r in culprits})
    hints = [
        f"Check the GPU(s) of {ranks_text(culprits)} on {nodes_text(nodes)}: `nvidia-smi -q -d "
        "PERFORMANCE,TEMPERATURE,POWER` (clock event reasons, temperature, power draw against its limit); a "
        "failing fan or airflow, a power cap set on that node, a GPU to replace.",
    ]
    summary = (f"{ranks_text(culprits)} {'sets' if len(culprits) == 1 else 'set'} the job's pace: "
               f"its GPU{'s' if len(culprits) > 1 else ''} held down to {min(clocks[r] for r in culprits)} MHz "
               f"against {typical} MHz on the others")
    return ctx.diagnosis("straggler", culprits, ctx.now - ctx.job.cpu_level_window_s, summary, evidence, hints)
