"""A diagnosed job as plain JSON-ready data: the shape of ``GET /diagnose?format=json``.

The text report and the web page render from this same data.
"""

from __future__ import annotations

from typing import Any

from monitor.diagnosis import RankDiagnosis, RankView
from monitor.service import JobResult


def job_dict(result: JobResult) -> dict[str, Any]:
    view, d = result.view, result.diagnosis
    by_rank = {r.rank: r for r in d.ranks}
    job_last = view.job_progress_times[-1] if view.job_progress_times else None
    return {
        "job_id": view.job_id,
        "verdict": d.verdict,
        "culprit_ranks": list(d.culprit_ranks),
        "since": d.since,
        "summary": d.summary,
        "evidence": list(d.evidence),
        "hints": list(d.hints),
        "ranks": [rank_dict(r, by_rank.get(r.rank), job_last, view.now) for r in view.ranks],
        "world_size": view.world_size,
        "first_seen_at": view.first_seen_at,
        "last_report_at": result.last_report_at,
        "last_progress_at": result.last_progress_at,
        "job_step": view.job_step,
        "nodes": sorted(view.hosts),
        "stacks_unavailable_reason": view.stacks_unavailable_reason,
        "groups": [{"site": g.site, "ranks": list(g.ranks)} for g in d.groups],
        "now": view.now,
    }


def rank_dict(r: RankView, rd: RankDiagnosis | None, job_last_progress: float | None, now: float) -> dict[str, Any]:
    last = r.progress_times[-1] if r.progress_times else job_last_progress
    return {
        "rank": r.rank,
        "node": r.node,
        "pid": r.pid,
        "state": rd.state if rd else "unknown",
        "cpu_percent": r.cpu_percent,
        "step": r.step,
        "seconds_since_progress": max(0.0, now - last) if last is not None else None,
        "top_frame": rd.top_frame if rd else None,
        "wait_site": rd.wait_site if rd else None,
        "alive": r.alive,
        "proc_state": r.proc_state,
        "exit": (
            {"at": r.exit.at, "code": r.exit.code, "signal": r.exit.signal, "error": r.exit.error}
            if r.exit
            else None
        ),
        "seconds_since_report": max(0.0, now - r.observed_at),
        "stack_error": r.stack_error,
    }


def diagnose_dict(results: list[JobResult]) -> dict[str, Any]:
    return {"jobs": [job_dict(r) for r in results]}
