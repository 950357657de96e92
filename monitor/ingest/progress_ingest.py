"""A rank's progress report (steps its log printed) taken into the rank's or the job's history.

A log per rank feeds the rank's own history; a log the whole job shares (scope "job") feeds the
job's, read once per (node, source) however many ranks report it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from monitor.ingest.job_track import JobTrack
from monitor.ingest.pace import JobPace
from monitor.ingest.tracks import ProgressCursor, RankTrack
from monitor.ingest.wire import ProgressReport


def apply_progress(
    job: JobTrack, track: RankTrack, node: str, p: ProgressReport, received_at: float, offset: float
) -> None:
    """Add the steps of ``p`` not yet taken to the rank's (or, for a job-scope log, the job's) history."""
    if p.scope == "job":
        cursor = job.progress_cursors.setdefault((node, p.source), ProgressCursor())
    else:
        cursor = track.progress_cursor
    changed = cursor.events is not None and p.events != cursor.events
    first_sight = cursor.events is None
    cursor.events = p.events
    if changed or first_sight:
        source = ("job", node, p.source) if p.scope == "job" else ("rank", str(track.rank))
        if job.pace is None:
            job.pace = JobPace()
        job.pace.note(source, received_at, p.events)
    points = [(t, step) for t, step in p.recent if cursor.mark is None or t > cursor.mark]
    new = [t for t, _ in points]
    if not new and (changed or (first_sight and p.events > 0)):
        # Progress without a cadence list: fall back on when the agent saw the line.
        if p.step_at is not None and (cursor.mark is None or p.step_at > cursor.mark):
            new = [p.step_at]
        elif changed:
            new = [received_at - offset]
        if new and p.step is not None:
            points = [(new[0], p.step)]
    if not new:
        return
    cursor.mark = max(new)
    shifted = sorted(t + offset for t in new)
    shifted_points = sorted((t + offset, step) for t, step in points)
    if p.scope == "job":
        _add_times(job.progress_times, shifted)
        _add_points(job.progress_points, shifted_points)
        if job.job_step_at is None or shifted[-1] >= job.job_step_at:
            job.job_step, job.job_step_at = p.step, shifted[-1]
    else:
        _add_times(track.progress_times, shifted)
        _add_points(track.progress_points, shifted_points)
        track.last_progress_at = track.progress_times[-1]
        track.progress_revision += 1
        job.note_rank_progress(track.last_progress_at)


def _add_times(times: deque[float], new: Iterable[float]) -> None:
    for t in new:
        if len(times) >= 2 and times[-1] == times[-2] == t:
            # Several steps read in one go share a time: two of them tell the cadence that a
            # sighting brought more than one step (diagnosis.cadence), and the history then
            # spans PROGRESS_HISTORY / 2 sightings, so a pause is remembered, however fast the steps.
            continue
        if times and t < times[-1]:
            # Rare (two logs of one job on different clocks): keep the list ordered.
            merged = sorted([*times, t])
            times.clear()
            times.extend(merged[-(times.maxlen or len(merged)) :])
        else:
            times.append(t)


def _add_points(points: deque[tuple[float, int]], new: Iterable[tuple[float, int]]) -> None:
    """Like ``_add_times``, for (time, step) points."""
    for point in new:
        if points and point[0] < points[-1][0]:
            merged = sorted([*points, point])
            points.clear()
            points.extend(merged[-(points.maxlen or len(merged)) :])
        else:
            points.append(point)
