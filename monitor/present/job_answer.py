"""A diagnosed job as plain JSON-ready data: the shape of ``GET /diagnose?format=json``.

The text report and the web page render from this same data.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from monitor.diagnosis import Frame, LauncherView, OrphanView, RankDiagnosis, RankView, Stack
from monitor.diagnosis.model import FlightRecord, PaceView
from monitor.diagnosis.stacks import memo
from monitor.diagnosis.verdict_catalogue import QUIET
from monitor.present.grouping import group_ranks
from monitor.engine.job_names import env_names
from monitor.present.rank_ranges import ranks_text as ranks_text  # re-exported: render_text and tests import it from here
from monitor.engine.published import JobResult
from monitor.present.stack_tree import stack_tree

T = TypeVar("T")
_NOT_MADE = object()

# Innermost main-thread Python frames compared when grouping ranks by stack.
STACK_GROUP_DEPTH = 8
# A job's answer lists every rank up to this many; a bigger job's lists the culprits and the
# lowest ranks, this many in all, and pages through the rest (``listed_ranks``).
RANKS_LISTED_BY_DEFAULT = 256
# Groups of ranks (same state, same place) a job's answer lists, the culprits' groups first, then
# the biggest: what a page can show of 10,000 ranks besides the sample in ``ranks``.
RANK_GROUPS_LISTED = 24
# Jobs with these verdicts get no merged stack tree: nobody reads it for them, and at 10,000
# ranks it is a noticeable share of each refresh of a healthy job's answer.
NO_STACK_TREE = QUIET


def job_head(result: JobResult) -> dict[str, Any]:
    """What every view of a job starts with: who it is and its verdict."""
    d = result.diagnosis
    return {
        "job_id": result.view.job_id,
        # The same job as other nodes named it (a host name here, an address there).
        "aliases": list(result.aliases),
        # What people call it: Slurm job, Kubernetes pods, torchelastic run (monitor/engine/job_names.py).
        "names": result.names,
        "verdict": d.verdict,
        "culprit_ranks": list(d.culprit_ranks),
        "since": d.since,
        "summary": d.summary,
        # The job's pace against its own best (monitor/ingest/pace.py); null until it settled.
        "pace": pace_dict(result.view.pace),
    }


def pace_dict(pace: PaceView | None) -> dict[str, Any] | None:
    if pace is None:
        return None
    return {
        "ratio": round(pace.ratio, 3),
        "now_s": round(pace.now_s, 4),
        "baseline_s": round(pace.baseline_s, 4),
        "goodput": round(pace.goodput, 3) if pace.goodput is not None else None,
        "slow_since": pace.slow_since,
        "settled_at": pace.settled_at,
    }


def listed_ranks(result: JobResult, offset: int = 0, limit: int | None = None) -> list[RankView]:
    """The ranks a job's answer lists: all of them up to RANKS_LISTED_BY_DEFAULT; past that, by
    default the culprits and then the lowest ranks, that many in all; with ``offset``/``limit``,
    that page of the ranks in rank order (every rank of a 10,000-rank job stays one request away,
    and its default answer stays small)."""
    ranks = result.view.ranks
    if offset == 0 and limit is None:
        if len(ranks) <= RANKS_LISTED_BY_DEFAULT:
            return list(ranks)
        culprits = set(result.diagnosis.culprit_ranks)
        first = [r for r in ranks if r.rank in culprits]
        rest = (r for r in ranks if r.rank not in culprits)
        return first + list(itertools.islice(rest, max(0, RANKS_LISTED_BY_DEFAULT - len(first))))
    return list(ranks[offset : offset + (limit if limit is not None else RANKS_LISTED_BY_DEFAULT)])


def job_dict(result: JobResult, ranks_offset: int = 0, ranks_limit: int | None = None) -> dict[str, Any]:
    """The job as JSON data. ``ranks`` holds the ranks ``listed_ranks`` picks; ``ranks_total`` says
    how many there are."""
    view, d = result.view, result.diagnosis
    listed = listed_ranks(result, ranks_offset, ranks_limit)
    chosen = {r.rank for r in listed}
    by_rank = {rd.rank: rd for rd in d.ranks if rd.rank in chosen}
    job_last = view.job_progress_times[-1] if view.job_progress_times else None
    return {
        **job_head(result),
        "evidence": list(d.evidence),
        "hints": list(d.hints),
        "ranks": [
            rank_dict(r, by_rank.get(r.rank), job_last, view.now, r.progress_points or result.job_progress_points)
            for r in listed
        ],
        "ranks_total": len(view.ranks),
        "ranks_offset": ranks_offset,
        "world_size": view.world_size,
        "first_seen_at": view.first_seen_at,
        "last_report_at": result.last_report_at,
        "last_progress_at": result.last_progress_at,
        "job_step": view.job_step,
        "nodes": sorted(view.hosts),
        "stacks_unavailable_reason": view.stacks_unavailable_reason,
        "groups": [{"site": g.site, "ranks": list(g.ranks)} for g in d.groups],
        # Each over every rank: made once per diagnosis, for every answer that shows the job.
        **_once(result, "rank_groups", lambda: rank_groups(d.ranks, d.culprit_ranks)),
        "stack_groups": _once(result, "stack_groups", lambda: stack_groups(view.ranks)),
        "stack_tree": None if d.verdict in NO_STACK_TREE else _once(
            result, "stack_tree", lambda: stack_tree(view.ranks, view.world_size)),
        "launchers": [launcher_dict(launcher) for launcher in view.launchers],
        "orphans": [orphan_dict(o) for o in view.orphans],
        # Time the job spent under each alarm, times its live ranks (and GPUs): monitor/engine/hang_cost.py.
        "lost": {"rank_seconds": result.lost_rank_seconds, "gpu_seconds": result.lost_gpu_seconds},
        # Ranks another node claimed while their own node runs them: ignored, shown (monitor.ingest.rank_claims).
        "rank_conflicts": [
            {"rank": c.rank, "claimed_by": c.claimed_by, "held_by": c.held_by, "first_at": c.first_at,
             "last_at": c.last_at, "refused": c.refused, "reason": c.reason}
            for c in result.rank_conflicts],
        "now": view.now,
    }


def _once(result: JobResult, name: str, make: Callable[[], T]) -> T:
    """``make()``, kept on the diagnosis it describes (read-only from then on): the JSON answer,
    the text answer and the evidence download of a 10,000-rank job share one stack tree. Two
    renders at once may both make it; either result is the same."""
    kept = result.__dict__.get(name, _NOT_MADE)
    if kept is _NOT_MADE:
        kept = result.__dict__[name] = make()
    return kept  # type: ignore[no-any-return]


def rank_groups(ranks: Sequence[RankDiagnosis], culprits: Iterable[int],
                limit: int = RANK_GROUPS_LISTED) -> dict[str, Any]:
    """Every rank in one group per (state, place): ``rank_groups``, the culprits' groups first, then
    by size, at most ``limit`` of them; ``rank_groups_total`` counts them all."""
    by_place: dict[tuple[str, str], list[int]] = {}
    for rd in ranks:
        by_place.setdefault((rd.state, rd.wait_site or rd.top_frame or ""), []).append(rd.rank)
    blamed = set(culprits)
    groups = [{"state": state, "where": where or None, "count": len(members), "ranks": ranks_text(members),
               "culprit": not blamed.isdisjoint(members)}
              for (state, where), members in by_place.items()]
    groups.sort(key=lambda g: (not g["culprit"], -g["count"], g["ranks"]))
    return {"rank_groups": groups[:limit], "rank_groups_total": len(groups)}


def stack_frames(stack: Stack | None, depth: int = STACK_GROUP_DEPTH) -> tuple[str, ...]:
    """The innermost ``depth`` Python frames of a main-thread stack, as ``name (file:line)``."""
    if stack is None:
        return ()
    # Once per dump: every answer groups every rank by it (10,000 in a giant job).
    return memo(stack, ("frames", depth), lambda: tuple(f.where() for f in stack.frames if not f.native)[:depth])


def stack_groups(ranks: Sequence[RankView], depth: int = STACK_GROUP_DEPTH) -> list[dict[str, Any]]:
    """Live ranks grouped by identical main-thread Python stacks (STAT's equivalence classes).

    Ranks without a stack (or with no Python frame in it) and ended ranks are left out.
    Biggest group first, so the odd ones out come last; ties by lowest rank.
    """
    keyed = ((stack_frames(r.stack, depth), r.rank) for r in ranks if r.alive and r.stack is not None)
    by_frames = group_ranks((frames, rank) for frames, rank in keyed if frames)
    groups = sorted(by_frames.items(), key=lambda item: (-len(item[1]), min(item[1])))
    return [{"ranks": sorted(members), "frames": list(frames)} for frames, members in groups]


def _top_frame(stack: Stack | None) -> str | None:
    if stack is None or not stack.frames:
        return None
    python: list[Frame] = [f for f in stack.frames if not f.native]
    return (python or list(stack.frames))[0].where()


def launcher_dict(launcher: LauncherView) -> dict[str, Any]:
    return {
        "node": launcher.node,
        "pid": launcher.pid,
        "alive": launcher.alive,
        "node_rank": launcher.node_rank,
        "nnodes": launcher.nnodes,
        "nproc_per_node": launcher.nproc_per_node,
        "master_addr": launcher.master_addr,
        "master_port": launcher.master_port,
        "worker_count": launcher.worker_count,
        "top_frame": _top_frame(launcher.stack),
        "first_seen_at": launcher.first_seen_at,
        "exit": _exit_dict(launcher.exit),
    }


def orphan_dict(orphan: OrphanView) -> dict[str, Any]:
    return {
        "node": orphan.node,
        "pid": orphan.pid,
        "cmdline": orphan.cmdline,
        "listening_ports": list(orphan.listening_ports),
    }


def _exit_dict(exit: Any) -> dict[str, Any] | None:
    if exit is None:
        return None
    return {"at": exit.at, "code": exit.code, "signal": exit.signal, "error": exit.error}


def rank_dict(
    r: RankView,
    rd: RankDiagnosis | None,
    job_last_progress: float | None,
    now: float,
    progress: Sequence[tuple[float, int]] = (),
) -> dict[str, Any]:
    last = r.progress_times[-1] if r.progress_times else job_last_progress
    return {
        "rank": r.rank,
        "node": r.node,
        "pid": r.pid,
        "state": rd.state if rd else "unknown",
        "cpu_percent": r.cpu_percent,
        # The median of its CPU over the last half-minute: the work it does per second (slow_rank).
        "cpu_level_percent": r.cpu_level_percent,
        "step": r.step,
        "progress_pattern": r.progress_pattern,
        "seconds_since_progress": max(0.0, now - last) if last is not None else None,
        "top_frame": rd.top_frame if rd else None,
        "wait_site": rd.wait_site if rd else None,
        "alive": r.alive,
        "proc_state": r.proc_state,
        "exit": _exit_dict(r.exit),
        "seconds_since_report": max(0.0, now - r.observed_at),
        "stack_error": r.stack_error,
        "collective_wait_share": r.collective_wait_share,
        "compute_dtype": r.compute_dtype,
        "gpu_utilization_percent": r.gpu_utilization_percent,
        # CPU denied to it (medians over the straggler window): waiting in a run queue, throttled by a quota.
        "run_queue_wait_percent": r.run_queue_wait_level_percent,
        "cpu_throttled_percent": r.cpu_throttled_level_percent,
        # Recent [time, step] points (monitor clock), oldest first, for the page's chart.
        "progress": list(progress),
        "flight_recorder": flight_recorder_dict(r.flight_recorder),
        # The rank's own pod, when it runs in one (each rank of a job may have its own).
        "k8s_pod": env_names(r.env).get("k8s_pod"),
        # The launcher its agent saw and how it knew the rank ("env:RANK", "mp.spawn:start-order", ...).
        "launcher": r.launcher,
        "identified_by": r.identified_by,
    }


def flight_recorder_dict(fr: FlightRecord | None) -> dict[str, Any] | None:
    """How far the rank got per process group, by its latest Flight Recorder dump."""
    if fr is None:
        return None
    return {
        "dumped_at": fr.dumped_at,
        "path": fr.path,
        "status": fr.status,
        "groups": [
            {"pg": g.pg, "desc": g.desc, "last_enqueued": g.last_enqueued, "last_started": g.last_started,
             "last_completed": g.last_completed, "last_enqueued_op": g.op_of(g.last_enqueued)}
            for g in fr.groups
        ],
    }
