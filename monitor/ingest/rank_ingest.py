"""One rank's or launcher's entry of a report, taken into its track and its job's.

Functions of the job and the entry alone: which job and run an entry belongs to is decided
before (``monitor.ingest.job_identity``), and ``monitor.ingest.state`` walks the report. Ingest is the
monitor's hot path: what the agent re-sends unchanged is recognised and skipped.
"""

from __future__ import annotations

import heapq

from collections.abc import Callable
from typing import TypeVar

import msgspec

from monitor.diagnosis import ExitView, Frame, LogPhase, Stack
from monitor.diagnosis.activity import MOVING_BYTES_PER_S, MOVING_QUEUE_BYTES
from monitor.diagnosis.model import CPU_LEVEL_WINDOW_S
from monitor.diagnosis.phases import phase_of
from monitor.ingest.flight_recorder_views import flight_record
from monitor.ingest.job_track import JobTrack
from monitor.ingest.progress_ingest import apply_progress
from monitor.ingest.tracks import LauncherTrack, RankTrack, SocketKey
from monitor.ingest.wire import ExitReport, LauncherReport, RankReport, SchedReport, SocketReport, StackReport

_Reported = TypeVar("_Reported", RankReport, LauncherReport)

# Below this CPU percent a rank counts as idle (waiting, not computing).
IDLE_CPU_PERCENT = 10.0
# Error lines kept per rank: the agent sends at most 10 (agent/logs.py KEPT_ERRORS). More only
# grew memory for junk: 2,000 junk jobs of 13 ranks, each with 50 lines of 2 KB, held 2.6 GB.
LOG_ERRORS_KEPT = 10
KNOWN_SITES_KEPT = 64

# ``wait_site(stack, cpu_percent)``: the collective call site a stack waits in, if any.
WaitSite = Callable[[Stack, float | None], str | None]


def apply_rank(
    job: JobTrack,
    node: str,
    rr: RankReport,
    received_at: float,
    offset: float,
    wait_site: WaitSite,
    cpu_level_window_s: float = CPU_LEVEL_WINDOW_S,
) -> None:
    """Take a rank's entry into its track (a new pid is a new process: a new track that keeps the
    rank's progress history) and into its job."""
    rr = _with_kept_errors(rr)
    job.last_report_at = max(job.last_report_at, received_at)
    if job.reported_world_size != rr.world_size:
        job.reported_world_size = rr.world_size
        job.lifecycle_revision += 1
    track = job.ranks.get(rr.rank)
    if track is None or track.pid != rr.pid:
        # A new process for this rank (first sight, or restarted by its launcher):
        # per-process facts start over, the rank's progress history carries on.
        fresh = RankTrack(
            job_id=job.job_id,
            rank=rr.rank,
            node=node,
            pid=rr.pid,
            first_seen_at=received_at,
            observed_at=received_at,
            latest=rr,
        )
        if track is not None:
            fresh.progress_times = track.progress_times
            fresh.progress_points = track.progress_points
            fresh.progress_cursor = track.progress_cursor
            fresh.last_progress_at = track.last_progress_at
            fresh.first_seen_at = track.first_seen_at
        previous_observed = None
        job.held_ranks.discard(rr.rank)
        track = job.ranks[rr.rank] = fresh
        job.lifecycle_revision += 1
    else:
        previous_observed = track.observed_at
    track.node = node
    track.latest = rr
    track.observed_at = received_at
    track.vanished = False
    track.seen_alive = track.seen_alive or rr.alive
    track.revision += 1

    if rr.state != track.proc_state:
        # Entering or leaving a stop (or death) can turn the verdict at once; running and
        # sleeping (R, S, D) alternate all the time in a healthy job and must not force a pass
        # over it (10,000 ranks flip every second).
        if _turns_verdict(track.proc_state) or _turns_verdict(rr.state):
            job.lifecycle_revision += 1
        track.proc_state = rr.state
        track.state_since = received_at
    moving = (rr.write_bytes_per_s or 0.0) >= MOVING_BYTES_PER_S or (
        rr.sockets is not None and send_queue_drained(track.socket_reports, rr.sockets))
    if moving:
        track.moved_at = received_at
    main_cpu = rr.threads.main_cpu_percent if rr.threads is not None else None
    if main_cpu is not None and main_cpu > 0:
        track.main_moved_at = received_at
    # Levels move only while the job steps (monitor.ingest.tracks.Level): its latest step so far.
    progressed_at = job.last_progress_at
    if rr.sched is not None:
        _apply_sched(track, rr.sched, received_at, cpu_level_window_s, progressed_at)
    if rr.cpu_percent is not None:
        track.cpu_since = previous_observed  # the agent measures CPU over the interval since its report before
        track.cpu.add(received_at, rr.cpu_percent, cpu_level_window_s, progressed_at)
        # Idle is neither computing nor moving data: a rank sending over a slow link or
        # writing a checkpoint at low CPU is at work.
        if rr.cpu_percent < IDLE_CPU_PERCENT and not moving:
            if track.idle_since is None:
                # cpu_percent is measured over the interval since the agent's previous
                # sample, so the rank has been idle since about that report.
                track.idle_since = previous_observed if previous_observed is not None else received_at
        else:
            if track.idle_since is not None and previous_observed is not None:
                # Idle, then at work again: a pause the job came back from, where its stacks saw it.
                job.note_pause(track.held_site if track.held_stacks else "", previous_observed - track.idle_since)
            track.idle_since = None
            track.worked_at = received_at
            _not_held(job, track)
            if job.working_since is None:
                job.working_since = received_at

    track.log_errors = _merge_lines(track.log_errors, rr.log_errors, LOG_ERRORS_KEPT)
    if track.alive != rr.alive:
        job.lifecycle_revision += 1
    track.alive = rr.alive
    if not rr.alive:
        _not_held(job, track)
    track.exit = None if rr.alive else _exit_view(track.exit, rr.exit, track.log_errors, received_at, offset)

    # The agent re-sends its latest stack with every report: only a new one is converted,
    # classified and sampled (ingest is the monitor's hot path).
    if rr.stack is not None and (track.last_stack_mark is None or rr.stack.taken_at > track.last_stack_mark):
        track.last_stack_mark = rr.stack.taken_at
        track.stack = to_stack(rr.stack, offset)
        phase = phase_of(track.stack)
        if phase is not None:
            job.mark_phase(track.stack.taken_at, phase)
        site = wait_site(track.stack, rr.cpu_percent)
        track.pending_wait_site = site
        if site and progressed_at is not None and track.stack.taken_at < progressed_at:
            # A stack that arrives after the step it preceded: a regular sync point already.
            _learn(job, track, site)
        elif site:
            job.pending_wait_ranks.add(track.rank)
            _push_pending(job, track.stack.taken_at, track.rank)
        else:
            job.pending_wait_ranks.discard(track.rank)
        track.add_wait_sample(track.stack.taken_at, site is not None)
        _note_held(job, track, site)
    if rr.sockets is not None:  # None: a delta report, sockets unchanged
        track.sockets_since = _sockets_since(track.sockets_since, rr.sockets, received_at)
        track.socket_reports = {(s.local, s.remote, s.state): s for s in rr.sockets}
    if rr.env:
        track.env = dict(rr.env)
    if rr.error_file is not None and rr.error_file.message:
        track.error_file_message = rr.error_file.message
    if rr.compute_dtype is not None:
        track.compute_dtype = rr.compute_dtype
    if rr.compute_dtype_line is not None:
        track.compute_dtype_line = rr.compute_dtype_line
    if rr.log_phase is None:
        track.log_phase = None  # the agent saw a step since: the phase is over
    else:
        # The agent re-sends its latest phase line: a new one is known by the agent's clock.
        if rr.log_phase.seen_at != track.log_phase_mark:
            track.log_phase_mark = rr.log_phase.seen_at
            track.log_phase = LogPhase(rr.log_phase.phase, rr.log_phase.seen_at + offset, rr.log_phase.line)
            job.mark_phase(track.log_phase.seen_at, track.log_phase.phase)
    # null: no dump, or the same one (a delta); the agent re-sends it in full reports.
    if rr.flight_recorder is not None and rr.flight_recorder != track.flight_recorder_report:
        track.flight_recorder_report = rr.flight_recorder
        track.flight_recorder = flight_record(rr.flight_recorder, offset)
    if rr.progress is not None:
        apply_progress(job, track, node, rr.progress, received_at, offset)


def _apply_sched(track: RankTrack, sched: SchedReport, received_at: float, window_s: float,
                 progressed_at: float | None) -> None:
    """The CPU denied to the rank over the agent's last interval, into its levels."""
    if sched.run_queue_wait_percent is not None:
        track.run_queue_wait.add(received_at, sched.run_queue_wait_percent, window_s, progressed_at)
    if sched.cpu_throttled_percent is not None:
        track.cpu_throttled.add(received_at, sched.cpu_throttled_percent, window_s, progressed_at)
    if sched.cgroup:
        track.cgroup = sched.cgroup


def _note_held(job: JobTrack, track: RankTrack, site: str | None) -> None:
    """Whether the rank's new stack shows it where its stacks since it went idle did (RankView.held_stacks).
    Only a rank seen at work before it went idle counts: one that never worked (a light job, a rank
    seen first in its stall) gives no idle stretch to time."""
    stack = track.stack
    if (stack is None or track.idle_since is None or track.worked_at is None
            or track.worked_at > track.idle_since or stack.taken_at < track.idle_since):
        _not_held(job, track)
        return
    place = tuple((f.name, f.file, f.line) for f in stack.frames if not f.native)
    if not place:
        _not_held(job, track)  # no Python frame: nothing says where it is
        return
    if place == track.held_place:
        track.held_stacks += 1
        track.held_last_at = stack.taken_at
        return
    # First seen here: since it went idle (its first stack since), or since the last stack that
    # showed it elsewhere (it moved in between, idle or not).
    track.held_since = track.idle_since if track.held_place is None else track.held_last_at
    track.held_place, track.held_stacks, track.held_last_at = place, 1, stack.taken_at
    job.held_ranks.add(track.rank)
    top = next((f for f in stack.frames if not f.native), None)
    track.held_site = site or (top.where() if top is not None else "")
    # The ranks' own clock may turn the verdict now (diagnosis.held): a pass is due even while the
    # log says the job advances. Once per rank and place, not once per stack.
    job.lifecycle_revision += 1


def _not_held(job: JobTrack, track: RankTrack) -> None:
    if not track.held_stacks:
        return  # the common case on the hot path: a rank at work, held nowhere
    job.held_ranks.discard(track.rank)
    track.held_place, track.held_stacks, track.held_site = None, 0, ""
    track.held_since = track.held_last_at = None


def apply_launcher(job: JobTrack, node: str, lr: LauncherReport, received_at: float, offset: float) -> None:
    lr = _with_kept_errors(lr)
    """Take a launcher's entry into its track, by (node, pid), and into its job."""
    job.last_report_at = max(job.last_report_at, received_at)
    track = job.launchers.get((node, lr.pid))
    if track is None:
        track = job.launchers[(node, lr.pid)] = LauncherTrack(
            job_id=job.job_id, node=node, pid=lr.pid, first_seen_at=received_at, observed_at=received_at, latest=lr
        )
        job.lifecycle_revision += 1
    track.latest = lr
    track.observed_at = received_at
    errors = _merge_lines(track.log_errors, lr.log_errors, LOG_ERRORS_KEPT)
    if errors != track.log_errors or track.alive != lr.alive or track.vanished:
        job.lifecycle_revision += 1
    track.vanished = False
    track.log_errors = errors
    track.alive = lr.alive
    track.exit = None if lr.alive else _exit_view(track.exit, lr.exit, track.log_errors, received_at, offset)
    if lr.stack is not None:
        track.stack = to_stack(lr.stack, offset)
    track.sockets_since = _sockets_since(track.sockets_since, lr.sockets, received_at)


def _turns_verdict(state: str | None) -> bool:
    """Stopped (T), traced (t), zombie or dead: process states that are verdicts of their own."""
    return state in ("T", "t", "Z", "X")


def mark_vanished(track: RankTrack | LauncherTrack) -> None:
    """The agent stopped listing this process without saying it ended: it ended when last seen."""
    if isinstance(track, RankTrack):
        track.revision += 1
    track.alive = False
    track.vanished = True
    error = track.log_errors[-1] if track.log_errors else None
    track.exit = ExitView(at=track.observed_at, error=error)


def learn_wait_sites(job: JobTrack) -> None:
    """A wait site counts as a regular sync point once the job progressed after a stack showed it."""
    progressed_at = job.last_progress_at
    if progressed_at is None or not job.pending_wait_ranks or progressed_at == job.wait_sites_learned_at:
        return
    # This runs for every report: it looks only when the job progressed since it last looked, and
    # then only at the ranks whose stack was taken before that progress (the heap's front). After a
    # monitor restart the job's progress moves a little with each node's full report while 10,000
    # ranks wait in a stalled job: walking them all each time was a fifth of the rebuild.
    job.wait_sites_learned_at = progressed_at
    heap = job.pending_wait_heap
    while heap and heap[0][0] < progressed_at:
        taken_at, rank = heapq.heappop(heap)
        track = job.ranks.get(rank)
        if rank not in job.pending_wait_ranks or track is None or track.stack is None:
            continue
        if track.stack.taken_at != taken_at:
            continue  # a newer stack replaced it: that one has its own entry
        if track.pending_wait_site:
            _learn(job, track, track.pending_wait_site)
        else:
            job.pending_wait_ranks.discard(rank)


def _push_pending(job: JobTrack, taken_at: float, rank: int) -> None:
    heap = job.pending_wait_heap
    heapq.heappush(heap, (taken_at, rank))
    if len(heap) > 4 * len(job.pending_wait_ranks) + 64:
        # A stalled job's ranks send new stacks while nothing progresses: keep one entry per rank.
        latest = {r: t.stack.taken_at for r in job.pending_wait_ranks
                  if (t := job.ranks.get(r)) is not None and t.stack is not None}
        heap[:] = [(at, r) for r, at in latest.items()]
        heapq.heapify(heap)


def _learn(job: JobTrack, track: RankTrack, site: str) -> None:
    if len(job.known_wait_sites) < KNOWN_SITES_KEPT:
        job.known_wait_sites.add(site)
    track.pending_wait_site = None
    job.pending_wait_ranks.discard(track.rank)


def to_stack(report: StackReport, offset: float) -> Stack:
    main = report.threads[0] if report.threads else None
    frames = tuple(Frame(f.name, f.file, f.line, f.native) for f in main.frames) if main else ()
    return Stack(
        taken_at=report.taken_at + offset,
        frames=frames,
        native=report.native,
        active=main.active if main else None,
    )


def send_queue_drained(previous: dict[SocketKey, SocketReport], sockets: list[SocketReport]) -> bool:
    """Bytes moved through a socket's send queue since the rank's last report: a queue of
    MOVING_QUEUE_BYTES or more, then or now, that changed. (A delta report without sockets: nothing
    changed, so nothing moved that it shows.)"""
    for s in sockets:
        before = previous.get((s.local, s.remote, s.state))
        if before is None or s.tx_queue is None or before.tx_queue is None:
            continue
        if s.tx_queue != before.tx_queue and max(s.tx_queue, before.tx_queue) >= MOVING_QUEUE_BYTES:
            return True
    return False


def _sockets_since(
    previous: dict[SocketKey, float], sockets: list[SocketReport], received_at: float
) -> dict[SocketKey, float]:
    """Keep the first-seen time of every socket still reported in the same state; new ones start now."""
    return {key: previous.get(key, received_at) for key in ((s.local, s.remote, s.state) for s in sockets)}


def _exit_view(
    current: ExitView | None, reported: ExitReport | None, log_errors: list[str], received_at: float, offset: float
) -> ExitView:
    error = log_errors[-1] if log_errors else None
    if reported is not None:
        return ExitView(at=reported.at + offset, code=reported.code, signal=reported.signal, error=error)
    if current is None:
        return ExitView(at=received_at, error=error)
    return ExitView(at=current.at, code=current.code, signal=current.signal, error=error)


def _with_kept_errors(report: _Reported) -> _Reported:
    """The report with its newest LOG_ERRORS_KEPT error lines only: it is kept as the track's
    ``latest``, and 50 lines of 2 KB a rank (the wire's limit, 10 from a real agent) were the most
    of what junk jobs held in memory."""
    if len(report.log_errors) <= LOG_ERRORS_KEPT:
        return report
    kept = report.log_errors[-LOG_ERRORS_KEPT:]
    if isinstance(report, msgspec.Struct):
        return msgspec.structs.replace(report, log_errors=kept)
    return report.model_copy(update={"log_errors": kept})


def _merge_lines(old: list[str], new: list[str], keep: int) -> list[str]:
    """Append ``new`` to ``old``, skipping the part of ``new`` that repeats the tail of ``old``.

    Works whether the agent sends its whole recent window each time or only new lines.
    """
    if not new:
        return old
    for overlap in range(min(len(old), len(new)), 0, -1):
        if old[-overlap:] == new[:overlap]:
            return (old + new[overlap:])[-keep:]
    return (old + new)[-keep:]
