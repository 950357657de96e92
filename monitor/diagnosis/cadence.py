"""A job's own pace, learned from its progress lines, and when silence means a stall.

A job with 70-second steps is not stuck after 20 seconds: the threshold scales
with the usual step interval and with the longest recent one, and never drops
below a floor that covers sampling delays. Silent stretches during which the job
was seen evaluating, checkpointing or compiling (``JobView.phase_marks``) are the
pace of that phase, not of steps: they set how long the next such phase may take
and leave the step threshold tight.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from statistics import median

from monitor.diagnosis.model import JobView

# Alarms are confirmed for another second before they are published (diagnosis.stability),
# so the floor sits below the 5 s it had before confirmation.
MIN_STALL_S = 3.5
# Until a few step intervals are known the pace is not: a slow first step (warm-up,
# torch.compile) is allowed this long. Deadlocks are still caught from the stacks.
WARMUP_GRACE_S = 120.0
WARMUP_INTERVALS = 3
WARMUP_STEPS = 3
# Silence is judged against the step time (MEDIAN_FACTOR x the median time per step) and
# against how often progress is seen at all (SIGHTINGS_FACTOR x the median gap between two
# sightings): the agent reads logs once per interval, so a job doing 16 steps a second is
# seen once a second, and three silent sightings in a row are already telling.
MEDIAN_FACTOR = 5.0
SIGHTINGS_FACTOR = 3.0
LONGEST_FACTOR = 1.5
RECENT_INTERVALS = 32


@dataclass(frozen=True)
class Cadence:
    last_progress_at: float | None
    # The median gap between two sightings of progress, and the longest recent one.
    median_interval_s: float | None
    longest_interval_s: float | None
    intervals_seen: int = 0
    # The highest step number the logs showed, if they number their steps.
    highest_step: int | None = None
    # The longest silent stretch seen per phase ("evaluation": 15.2, ...).
    phase_longest_s: tuple[tuple[str, float], ...] = ()
    # The median time per step: a gap's length over the progress events seen at its end
    # (equal to median_interval_s when every sighting brings one step).
    step_pace_s: float | None = None

    def phase_longest(self, phase: str) -> float | None:
        return dict(self.phase_longest_s).get(phase)

    @property
    def warming_up(self) -> bool:
        # Several steps may pass between two sightings of the log, so a high step
        # number also proves the job is past its first steps.
        if self.highest_step is not None and self.highest_step >= WARMUP_STEPS:
            return False
        return self.intervals_seen < WARMUP_INTERVALS

    @property
    def stall_after_s(self) -> float:
        if self.warming_up or self.median_interval_s is None:
            return WARMUP_GRACE_S
        pace = self.step_pace_s if self.step_pace_s is not None else self.median_interval_s
        return max(
            MIN_STALL_S,
            MEDIAN_FACTOR * pace,
            SIGHTINGS_FACTOR * self.median_interval_s,
            LONGEST_FACTOR * (self.longest_interval_s or 0.0),
        )

    def silent_for(self, now: float) -> float | None:
        return None if self.last_progress_at is None else max(0.0, now - self.last_progress_at)

    def is_stalled(self, now: float) -> bool:
        silent = self.silent_for(now)
        return silent is not None and silent > self.stall_after_s


def _gaps(times: tuple[float, ...]) -> list[tuple[float, float]]:
    """The recent gaps between distinct sightings (events read together share one time)."""
    ordered = sorted(set(times))[-(RECENT_INTERVALS + 1) :]
    return list(zip(ordered, ordered[1:]))


def _events_at(times: tuple[float, ...]) -> dict[float, int]:
    """How many progress events share each sighting time (several steps read in one go)."""
    counts: dict[float, int] = {}
    for t in times:
        counts[t] = counts.get(t, 0) + 1
    return counts


def _phases_in(gap: tuple[float, float], marks: tuple[tuple[float, str], ...]) -> set[str]:
    a, b = gap
    # A mark read together with the step that opened the gap belongs to the gap.
    return {phase for at, phase in marks if a <= at < b}


@dataclass(frozen=True)
class _Marks:
    """A job's phase marks with their hash worked out once per diagnosis, not once per source."""

    marks: tuple[tuple[float, str], ...]
    digest: int

    def __hash__(self) -> int:
        return self.digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Marks) and (self.marks is other.marks or self.marks == other.marks)


@dataclass(frozen=True)
class _SourcePace:
    """One progress source's pace (see ``job_cadence``); None fields when it has too few gaps."""

    median_s: float | None
    pace_s: float | None
    longest_s: float | None
    gaps: int
    phase_longest: tuple[tuple[str, float], ...]


@lru_cache(maxsize=1 << 16)
def _source_pace(times: tuple[float, ...], marks: _Marks) -> _SourcePace:
    """Memoised: a pass over a 10,000-rank job meets mostly the same sources as the last pass
    (a stalled job's logs do not move), and each costs tens of microseconds to time."""
    gaps = _gaps(times)
    events = _events_at(times)
    step_gaps = []
    phase_longest: dict[str, float] = {}
    for gap in gaps:
        phases = _phases_in(gap, marks.marks)
        for phase in phases:
            phase_longest[phase] = max(phase_longest.get(phase, 0.0), gap[1] - gap[0])
        if not phases:
            step_gaps.append(gap)
    # Too few plain steps to learn from: every gap counts (the old, cautious pace).
    counted = step_gaps if len(step_gaps) >= WARMUP_INTERVALS else gaps
    phases = tuple(phase_longest.items())
    if not counted:
        return _SourcePace(None, None, None, len(gaps), phases)
    return _SourcePace(
        median(b - a for a, b in counted),
        median((b - a) / events[b] for a, b in counted),
        max(b - a for a, b in counted),
        len(gaps),
        phases,
    )


def job_cadence(job: JobView) -> Cadence:
    """Each progress source (the job log, each rank's log) is timed on its own —
    merging them would halve the intervals — and the slowest source sets the pace."""
    sources = [job.job_progress_times] + [r.progress_times for r in job.ranks]
    sources = [s for s in sources if s]
    steps = [s for s in [job.job_step, *(r.step for r in job.ranks)] if s is not None]
    highest = max(steps, default=None)
    if not sources:
        return Cadence(None, None, None, 0, highest)
    last = max(s[-1] for s in sources)  # each source is in time order (JobView)
    marks = _Marks(job.phase_marks, hash(job.phase_marks))
    medians: list[float] = []
    paces: list[float] = []
    longest: list[float] = []
    phase_longest: dict[str, float] = {}
    seen = 0
    for times in sources:
        source = _source_pace(times, marks)
        for phase, gap in source.phase_longest:
            phase_longest[phase] = max(phase_longest.get(phase, 0.0), gap)
        if source.median_s is not None:
            medians.append(source.median_s)
            paces.append(source.pace_s)  # type: ignore[arg-type]
            longest.append(source.longest_s)  # type: ignore[arg-type]
            seen = max(seen, source.gaps)
    phases = tuple(sorted(phase_longest.items()))
    if not medians:
        return Cadence(last, None, None, 0, highest, phases)
    return Cadence(last, max(medians), max(longest), seen, highest, phases, max(paces))
