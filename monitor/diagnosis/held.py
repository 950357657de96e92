"""The ranks' own clock: what their main threads are doing outranks what the job prints (issue 32).

A log line is a hint. A side thread's counter ("[hb] rank 0 beat 812") keeps rising while the
training thread sits in ``all_reduce``; a job that logs every 100th step is silent for minutes
between two healthy lines; a save whose open never returns prints nothing either way. What does
not lie is the rank itself: a rank **held** at one place has had idle CPU and no bytes moving
since it went idle (after it was seen at work), and every stack taken since shows its main thread
at the same frames (``RankView.held_stacks``).

The job is stalled by its ranks' word when a rank has been held in a collective longer than the
job has ever waited there (or every rank has been held outside any collective that long: the loop
runs nowhere):

- the wait profile: ``HELD_PAUSE_FACTOR`` times the longest pause any rank came back from at that
  place (or at a place no stack saw), so a rank that waits 5 s for a slower peer every step waits
  15 s before it counts;
- the step: ``STEP_FACTOR`` times the time per step its numbered steps show (a line every 100 steps
  of 0.16 s is 0.16 s a step, not 16);
- never under ``HELD_MIN_S``; and while the job's pace is still unknown (its first steps), no
  sooner than a job without a log would be judged (``verdict.startup_allowance_s``);
- no rank moving data (a slow link, a checkpoint being written: they set the pace, they are not
  stuck).

Progress lines read after the stall began are then discounted, said so in the evidence, and the
stacks taken since decide the verdict as they do for a silent log (``verdict.stall``).

**Stuck I/O**: a rank held ``STUCK_IO_S`` in a phase that would otherwise earn a long grace (a
save, a load) is not saving: at 0% CPU with nothing written it waits on a file that does not
answer. Its phase no longer excuses the stall, and the evidence names the call and the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor.diagnosis.activity import STUCK_IO_S, Activity, classify, disk_wait_since, moving_data
from monitor.diagnosis.cadence import Cadence
from monitor.diagnosis.context import ranks_text
from monitor.diagnosis.model import JobView, RankView

HELD_MIN_S = 3.0
HELD_PAUSE_FACTOR = 3.0
STEP_FACTOR = 5.0


def held_since(rank: RankView) -> float | None:
    """Since when the rank has been held: at one place by its stacks (and its main thread idle), or in
    the kernel's disk wait with nothing written (no stack can be taken there). None: not held."""
    if not rank.alive:
        return None
    starts = [t for t in (rank.held_since if rank.held_stacks >= 1 else None, disk_wait_since(rank)) if t is not None]
    return min(starts, default=None)


def held_for(rank: RankView, now: float) -> float | None:
    """How long the rank has been held at one place, or None when it is not held."""
    since = held_since(rank)
    return None if since is None else max(0.0, now - since)


def step_time_s(job: JobView) -> float | None:
    """The job's time per step from its numbered steps: the slowest source's, as the pace is."""
    times = [t for t in [job.job_step_time_s, *(r.step_time_s for r in job.ranks)] if t is not None]
    return max(times, default=None)


def allowance_s(job: JobView, site: str, step_s: float | None) -> float:
    """How long a rank may be held at ``site`` before the job counts as stalled."""
    pauses = dict(job.pauses_by_site)
    longest = max(pauses.get(site, 0.0), pauses.get("", 0.0))
    return max(HELD_MIN_S, HELD_PAUSE_FACTOR * longest, STEP_FACTOR * (step_s or 0.0))


@dataclass(frozen=True)
class HeldStall:
    """The job stalled by its ranks' own state: since when, who is held past the allowance, and where."""

    since: float
    ranks: tuple[int, ...]
    site: str
    held_s: float
    allowance_s: float


def rank_activities(job: JobView) -> dict[int, Activity]:
    """Each rank's activity with its stacks fresh from when it went idle, whatever the log printed since."""
    return {r.rank: classify(r, r.idle_since if r.held_stacks else None) for r in job.ranks}


def held_stall(job: JobView, floor_s: float = 0.0) -> HeldStall | None:
    """The stall the ranks themselves show, or None. ``floor_s``: the least allowance (a job whose
    pace is not yet known is judged no sooner than one without a log)."""
    if not any(held_since(r) is not None for r in job.ranks):
        return None  # the common case, a job at work: no rank classified twice
    activities = rank_activities(job)
    live = [a for a in activities.values() if a.rank.alive]
    if not live or any(moving_data(a.rank) for a in live):
        return None
    step_s = step_time_s(job)
    over: list[tuple[Activity, float, float]] = []
    for a in live:
        if a.kind != "in_collective" or a.wait is None:
            continue
        held = held_for(a.rank, job.now)
        if held is None:
            continue
        allowed = max(floor_s, allowance_s(job, a.wait.site, step_s))
        if held >= allowed:
            over.append((a, held, allowed))
    if not over:
        over = _all_held_elsewhere(job, live, step_s, floor_s)
    if not over:
        return None
    first = max(over, key=lambda o: (o[1], -o[0].rank.rank))  # held longest
    since = job.now - first[1]
    return HeldStall(since, tuple(sorted(o[0].rank.rank for o in over)), place_of(first[0]), first[1], first[2])


def place_of(a: Activity) -> str:
    """Where a rank is held, as the wait profile names it (monitor.rank_ingest): its wait site, or its top frame."""
    return a.wait.site if a.wait is not None else (a.top_frame or "")


def _all_held_elsewhere(job: JobView, live: list[Activity], step_s: float | None,
                        floor_s: float) -> list[tuple[Activity, float, float]]:
    """Every live rank held outside any collective past its allowance: the training loop runs on no
    rank (all of them in a load that never returns, a queue a dead data loader never fills, a
    lock), so no rank waits on another, and only the ranks themselves can say it."""
    over = []
    for a in live:
        held = held_for(a.rank, job.now)
        if held is None or a.kind != "idle":
            return []
        allowed = max(floor_s, allowance_s(job, place_of(a), step_s))
        if held < allowed:
            return []
        over.append((a, held, allowed))
    return over


def discounted_lines(job: JobView, cadence: Cadence, stall: HeldStall) -> list[str]:
    """Evidence for progress lines read after the ranks stopped: what printed them, and why they do not count."""
    last = cadence.last_progress_at
    if last is None or last <= stall.since:
        return []
    patterns = sorted({r.progress_pattern for r in job.ranks
                       if r.progress_pattern and r.progress_times and r.progress_times[-1] > stall.since})
    printed = f" ({'; '.join(p[:160] for p in patterns[:2])})" if patterns else ""
    return [f"progress lines kept coming for {last - stall.since:.0f}s after the ranks stopped{printed}, but "
            f"{ranks_text(stall.ranks)} {'has' if len(stall.ranks) == 1 else 'have'} sat in {stall.site} "
            f"at idle CPU since then ({stall.held_s:.0f}s; {stall.allowance_s:.0f}s allowed by the job's own "
            "waits and step time): those lines are not training progress (a side thread's counter, a "
            "heartbeat) and are not counted"]


def held_evidence(stall: HeldStall) -> str:
    return (f"{ranks_text(stall.ranks)} held in {stall.site} for {stall.held_s:.0f}s at idle CPU, its stacks "
            f"unchanged (the job's own waits and step time allow {stall.allowance_s:.0f}s)")


def phase_void(a: Activity, now: float) -> bool:
    """Held STUCK_IO_S or longer outside a collective: whatever phase its frames show (a save, an
    evaluation), it is not in it at idle CPU with nothing written, and the phase excuses nothing."""
    if a.waiting or a.busy:
        return False
    held = held_for(a.rank, now)
    return held is not None and held >= STUCK_IO_S


def stuck_in_io(a: Activity, now: float) -> bool:
    """``phase_void`` in a file's path: a file-system call the agent saw it blocked in, a save or load
    in its frames, or the kernel's disk wait."""
    return phase_void(a, now) and (a.rank.blocked_io is not None or a.phase == "checkpoint"
                                    or a.rank.proc_state == "D")


def stuck_io_text(a: Activity, now: float) -> str:
    """What the stuck rank is blocked on: the call and file the agent read, the frame, for how long."""
    held = held_for(a.rank, now) or 0.0
    blocked = a.rank.blocked_io
    on = ""
    if blocked is not None:
        on = f" blocked in {blocked.syscall}" + (f" on {blocked.path}" if blocked.path else "")
    at = f" at {a.top_frame}" if a.top_frame else ""
    return (f"rank {a.rank.rank}{on}{at} for {held:.0f}s at idle CPU with no bytes written: "
            "stuck I/O, not a save in progress")
