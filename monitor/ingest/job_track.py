"""The monitor's record of one job: its ranks and launchers, and what is known of the job as a whole.

Ingest (``monitor.ingest.state``, ``monitor.ingest.rank_ingest``, ``monitor.ingest.progress_ingest``) keeps it up to
date report by report; ``monitor.engine.views`` reads it into the diagnosis's ``JobView``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from monitor.ingest.pace import JobPace
from monitor.ingest.tracks import (
    PROGRESS_HISTORY,
    PROGRESS_POINTS_KEPT,
    ClaimConflict,
    LauncherTrack,
    ProgressCursor,
    RankTrack,
)
from monitor.ingest.wire import LauncherReport

# Phase marks per job: one per phase episode is enough to tell what a silent stretch was.
PHASE_MARKS_KEPT = 64
# Places kept in a job's wait profile.
PAUSE_SITES_KEPT = 64


@dataclass
class JobTrack:
    job_id: str
    ranks: dict[int, RankTrack] = field(default_factory=dict)
    # Launchers of this job, by (node, pid).
    launchers: dict[tuple[str, int], LauncherTrack] = field(default_factory=dict)
    # The world size the ranks report (the latest one); None until a rank reported.
    reported_world_size: int | None = None
    last_report_at: float = 0.0
    progress_times: deque[float] = field(default_factory=lambda: deque(maxlen=PROGRESS_HISTORY))
    # (time, step) points from job-scope logs, like ``RankTrack.progress_points``.
    progress_points: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=PROGRESS_POINTS_KEPT))
    # One cursor per (node, log source): ranks sharing one log all report the same
    # lines, and this keeps each line once.
    progress_cursors: dict[tuple[str, str], ProgressCursor] = field(default_factory=dict)
    job_step: int | None = None
    job_step_at: float | None = None
    known_wait_sites: set[str] = field(default_factory=set)
    # (node, pid) of the ranks and launchers of the run that used this id before: their
    # ended entries, still listed by agents, are not this run's.
    previous_run_pids: frozenset[tuple[str, int]] = frozenset()
    # Other ids its ranks or launchers reported (see job_identity.canonical_job_id).
    aliases: set[str] = field(default_factory=set)
    # (monitor time, phase): see JobView.phase_marks.
    phase_marks: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=PHASE_MARKS_KEPT))
    # Counts changes that can turn a verdict at once: a rank or launcher appearing, ending,
    # vanishing or changing process state, the world size, a launcher's errors. The monitor
    # re-diagnoses a healthy, advancing job right away only when this moved (service.py).
    lifecycle_revision: int = 0
    # Kept as reports come, so that no report walks the job's ranks (a job may have 10,000):
    # the newest progress any rank's own log showed (ranks are never dropped from a job, and a
    # rank's progress only grows, so the running maximum is exact), and the ranks whose latest
    # stack waits at a site not yet known to be a regular sync point (rank_ingest.learn_wait_sites).
    rank_progress_at: float | None = None
    pending_wait_ranks: set[int] = field(default_factory=set)
    # (when its stack was taken, rank) for those ranks, oldest first (a heap; entries of stacks
    # replaced since are skipped): the ranks a step learns from are those at its front.
    pending_wait_heap: list[tuple[float, int]] = field(default_factory=list)
    wait_sites_learned_at: float | None = None
    # The job's rhythm from its ranks' CPU alone, for a job that logs no progress (JobView):
    # when a rank was first seen at work, and the longest pause any rank came back from.
    working_since: float | None = None
    longest_pause_s: float = 0.0
    # The longest pause any rank came back from, by where its stacks showed it (JobView.pauses_by_site).
    pauses_by_site: dict[str, float] = field(default_factory=dict)
    # Ranks held at one place since they went idle (RankTrack.held_stacks): the ranks' own clock
    # runs while they are, so the job is diagnosed at every pass, however the log advances.
    held_ranks: set[int] = field(default_factory=set)
    # Claims by other nodes to this job's ranks, refused (monitor.ingest.rank_claims), by rank.
    claim_conflicts: dict[int, ClaimConflict] = field(default_factory=dict)
    # The world size each node's live ranks of the job report, and the nodes by world size: a
    # rank number is taken only below the world size every other node reports (monitor.ingest.rank_claims).
    world_by_node: dict[str, int] = field(default_factory=dict)
    nodes_by_world: dict[int, set[str]] = field(default_factory=dict)
    # The node last found to vouch for each world size (rank_claims.world_bound looks there first).
    world_witness: dict[int, str] = field(default_factory=dict)
    # When each node first brought a rank of the job (monitor/engine/attribution.py: a node that joined late).
    node_joined_at: dict[str, float] = field(default_factory=dict)
    # The job's pace against its own history (monitor.ingest.pace); made at its first progress (a
    # job that never logs one, junk included, keeps none).
    pace: JobPace | None = None

    def note_pause(self, site: str, seconds: float) -> None:
        """A rank came back from a pause of ``seconds`` at ``site`` ("" where no stack saw it)."""
        if site not in self.pauses_by_site and len(self.pauses_by_site) >= PAUSE_SITES_KEPT:
            site = ""  # bounded: a job's ranks pause at a handful of places, a flood is not a profile
        self.pauses_by_site[site] = max(self.pauses_by_site.get(site, 0.0), seconds)
        self.longest_pause_s = max(self.longest_pause_s, seconds)

    def mark_phase(self, at: float, phase: str) -> None:
        """Note the job in ``phase`` at ``at``; repeats within one silent stretch add nothing."""
        last = self.phase_marks[-1] if self.phase_marks else None
        progressed = self.last_progress_at
        if last and last[1] == phase and (progressed is None or last[0] > progressed) and at >= last[0]:
            return
        self.phase_marks.append((at, phase))
        if last and at < last[0]:  # a late report: keep time order
            self.phase_marks = deque(sorted(self.phase_marks), maxlen=PHASE_MARKS_KEPT)

    @property
    def world_size(self) -> int:
        """What the ranks say; else nnodes x nproc_per_node from a launcher; else 1."""
        if self.reported_world_size is not None:
            return self.reported_world_size
        derived = [launcher_world_size(t.latest) for t in self.launchers.values()]
        return max((w for w in derived if w is not None), default=1)

    @property
    def first_seen_at(self) -> float:
        seen = [r.first_seen_at for r in self.ranks.values()]
        seen += [t.first_seen_at for t in self.launchers.values()]
        return min(seen, default=self.last_report_at)

    @property
    def nodes(self) -> set[str]:
        """The nodes the job runs on: its ranks' and its launchers' nodes."""
        return {t.node for t in self.ranks.values()} | {t.node for t in self.launchers.values()}

    def note_rank_progress(self, at: float) -> None:
        if self.rank_progress_at is None or at > self.rank_progress_at:
            self.rank_progress_at = at

    @property
    def last_progress_at(self) -> float | None:
        job_at = self.progress_times[-1] if self.progress_times else None
        if job_at is None or (self.rank_progress_at is not None and self.rank_progress_at > job_at):
            return self.rank_progress_at
        return job_at

    def any_alive(self) -> bool:
        """Whether a rank or launcher is alive: stops at the first one (per report, in a live job)."""
        return any(t.alive for t in self.ranks.values()) or any(t.alive for t in self.launchers.values())

    @property
    def ended_at(self) -> float | None:
        """When the last rank (or launcher) ended, if every one has; None while one is alive."""
        if self.any_alive() or not (self.ranks or self.launchers):
            return None
        tracks: list[RankTrack | LauncherTrack] = [*self.ranks.values(), *self.launchers.values()]
        return max((t.exit.at if t.exit else t.observed_at) for t in tracks)


def launcher_world_size(lr: LauncherReport) -> int | None:
    """nnodes x nproc_per_node when both are integers ("1:4" counts as 4; no --nnodes is torchrun's
    default, 1); else None."""
    nnodes, nproc = _max_int(lr.nnodes or "1"), _max_int(lr.nproc_per_node)
    return nnodes * nproc if nnodes and nproc else None


def _max_int(text: str | None) -> int | None:
    if not text:
        return None
    parts = text.strip().split(":")
    if not all(p.strip().isdecimal() for p in parts):
        return None
    return max(int(p) for p in parts)
