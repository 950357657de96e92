"""A job's pace against its own history: how long a step takes now, and how long it took at its best.

Fail-slow (a job running at a fraction of its pace) is a fall from the job's own pace, so each job
keeps one: the time per progress event of one of its progress sources (the job's shared log, else
the first rank whose own log advanced; in synchronous training every source moves at the job's
pace), measured over at least MEASURE_SPAN_S from the agent's running count of progress lines
(``ProgressReport.events``: exact however many lines one read brings, and however rarely the job
logs: a line every 100 steps is one event every 100 steps, the same unit before and after).

The baseline is the job's best settled pace in the last BASELINE_MEMORY_S: the lowest median of
SETTLE_MEASURES measures in a row. A slow start (compilation, warm-up, a slow link from the very
start) is never a fall, since the baseline is what the job has done; a job that stays slower for
longer than the memory has a new pace. The ratio (now over the baseline, > 1 slower) and the
goodput (progress made over the progress the baseline pace would have made) are what
``monitor.diagnosis.pace`` judges and /metrics shows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from monitor.diagnosis.model import PaceView

# A measure spans at least this long (a report a second: ten sightings or more).
MEASURE_SPAN_S = 10.0
# Measures in a row whose median is a settled pace (about 15 s of steady steps at one a second).
SETTLE_MEASURES = 5
# The baseline forgets paces older than this: a job slower for an hour runs at its new pace.
BASELINE_MEMORY_S = 3600.0
# A candidate baseline is kept at most this often (bounds the sliding minimum's length).
CANDIDATE_EVERY_S = 5.0
# Slow: the pace at least SLOW_RATIO times the baseline; no longer slow below SLOW_CLEAR_RATIO.
SLOW_RATIO = 3.0
SLOW_CLEAR_RATIO = 2.0
# Another source takes over when the followed one has not moved for this long while it moves (a
# rank whose log stopped: restarted, or the log rotated away).
SOURCE_STALE_S = 60.0
# Goodput is counted over this long at most.
GOODPUT_WINDOW_S = 3600.0

SourceKey = tuple[str, ...]


@dataclass
class JobPace:
    """One job's pace tracker: fed by ingest (``note``), read by the engine's pass (``view``)."""

    source: SourceKey | None = None
    source_moved_at: float | None = None
    # (monitor time, the source's event count) at each change, the oldest one MEASURE_SPAN_S back.
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    # Recent measures of seconds per event, newest last.
    measures: deque[float] = field(default_factory=lambda: deque(maxlen=SETTLE_MEASURES))
    # (time, settled pace) candidates, increasing: the front is the lowest (a sliding minimum).
    candidates: deque[tuple[float, float]] = field(default_factory=deque)
    candidate_at: float | None = None
    # The events counted since the baseline settled, as (time, events so far) per change, for goodput:
    # the oldest kept is the last at or before GOODPUT_WINDOW_S ago.
    progress: deque[tuple[float, int]] = field(default_factory=deque)
    counted: int = 0
    settled_at: float | None = None
    slow_since: float | None = None

    def note(self, source: SourceKey, at: float, events: int) -> None:
        """The source's running count of progress lines as of ``at`` (monitor clock)."""
        if self.source != source:
            if self.source is not None and self.source_moved_at is not None and at - self.source_moved_at < SOURCE_STALE_S:
                return
            self.source = source
            self.samples.clear()
            self.measures.clear()
        if self.samples and events == self.samples[-1][1]:
            return
        if self.samples and (events < self.samples[-1][1] or at < self.samples[-1][0]):
            self.samples.clear()  # the count started over (a new agent, a new log): measure afresh
            self.measures.clear()
        previous = self.samples[-1] if self.samples else None
        self.samples.append((at, events))
        self.source_moved_at = at
        if previous is None:
            return
        self._count(at, events - previous[1])
        while len(self.samples) >= 2 and self.samples[1][0] <= at - MEASURE_SPAN_S:
            self.samples.popleft()
        first_at, first_events = self.samples[0]
        if at - first_at < MEASURE_SPAN_S:
            return
        self.measures.append((at - first_at) / (events - first_events))
        if len(self.measures) == SETTLE_MEASURES:
            self._candidate(at, median(self.measures))

    def _candidate(self, at: float, pace: float) -> None:
        if self.candidate_at is not None and at - self.candidate_at < CANDIDATE_EVERY_S:
            if not self.candidates or pace >= self.candidates[0][1]:
                return  # kept at most every few seconds, unless it is a new best
        self.candidate_at = at
        while self.candidates and self.candidates[-1][1] >= pace:
            self.candidates.pop()
        self.candidates.append((at, pace))
        if self.settled_at is None:
            self.settled_at = at

    def _count(self, at: float, events: int) -> None:
        if self.settled_at is None:
            return
        self.counted += events
        self.progress.append((at, self.counted))
        # The oldest entry kept is the last one at or before the window's start.
        while len(self.progress) >= 2 and self.progress[1][0] <= at - GOODPUT_WINDOW_S:
            self.progress.popleft()

    def view(self, now: float) -> PaceView | None:
        """The job's pace as of ``now``; None until a baseline settled. Moves ``slow_since``."""
        while self.candidates and self.candidates[0][0] < now - BASELINE_MEMORY_S and len(self.candidates) > 1:
            self.candidates.popleft()
        if not self.candidates or not self.samples or not self.measures:
            return None
        baseline = self.candidates[0][1]
        last_at = self.samples[-1][0]
        # Silence since the last event is a step at least that long, once it is as long as a measure:
        # a fall shows before its first slow step ends. (A shorter one is the agent's reading rhythm.)
        silent = now - last_at
        now_s = max(self.measures[-1], silent) if silent >= MEASURE_SPAN_S else self.measures[-1]
        ratio = now_s / baseline if baseline > 0 else 1.0
        if ratio >= SLOW_RATIO:
            if self.slow_since is None:
                self.slow_since = now
        elif ratio < SLOW_CLEAR_RATIO:
            self.slow_since = None
        return PaceView(baseline_s=baseline, now_s=now_s, ratio=ratio, slow_since=self.slow_since,
                        goodput=self._goodput(now, baseline), settled_at=self.settled_at)

    def _goodput(self, now: float, baseline: float) -> float | None:
        """Progress made over what the baseline pace makes in the same time, since the baseline settled
        (GOODPUT_WINDOW_S at most): 1 at pace, a third at a third of it, 0 stalled."""
        start = max(self.settled_at or now, now - GOODPUT_WINDOW_S)
        span = now - start
        if span <= 0:
            return None
        oldest = self.progress[0] if self.progress else None
        before = oldest[1] if oldest is not None and oldest[0] <= start else 0
        made = self.counted - before
        return min(1.0, made * baseline / span)
