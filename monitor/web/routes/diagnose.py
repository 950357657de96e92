"""``GET /diagnose`` (text or JSON, full or summary, filtered and paged); per job its verdict history,
its ranks' state timeline and the whole evidence as one download."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

from monitor.present.answers import answer_bytes, dumps, select, summary_dict
from monitor.web.page_links import page_links
from monitor.present.job_answer import RANKS_LISTED_BY_DEFAULT, job_dict
from monitor.present.progress_groups import LINES_SHOWN, ProgressGroup, progress_groups, progress_groups_dict
from monitor.present.timeline_groups import ROWS_SHOWN, culprits_first, span_groups, span_groups_dict
from monitor.present.render_text import render_monitor_status, render_text
from monitor.web.routes.actions import job_actions
from monitor.web.routes.captures import job_captures
from monitor.web.routes.deps import MonitorDep
from hangwatch_common.safe_text import one_line, text_block
from monitor.engine.published import JobResult
from monitor.engine.service import GIANT_JOB_RANKS, Monitor


class _JobIdConvertor(Convertor[str]):
    """A job id in a path: any characters, "/" and newlines included (ids come from the jobs)."""

    regex = "[\\s\\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("job_id", _JobIdConvertor())
router = APIRouter()
T = TypeVar("T")
# Rendering yields to the event loop after about this much work, so a big answer does not stall ingest.
STEP_S = 0.002
# The most ranks one page of a job's ranks holds.
RANKS_LIMIT_MAX = 100_000
# The most ranks one timeline answer lists one by one (the page asks for none: it draws the groups).
TIMELINE_LIMIT_MAX = 100_000
# The most groups (of states, of progress) one timeline answer holds, unless it holds them all.
TIMELINE_ROWS_MAX = 1000


def monitor_status(request: Request, monitor: Monitor) -> dict[str, Any]:
    """The monitor's own health, beside the jobs: is it keeping up, and how old are its verdicts."""
    guard = request.app.state.load_guard
    status = monitor.status()
    now = status.at
    return {
        "overloaded": guard.overloaded,
        "loop_lag_s": round(guard.lag_s, 3),
        "reports_shed_last_minute": guard.shed_recently(time.monotonic()),
        "diagnosis_pass_at": status.last_pass_at,
        "diagnosis_pass_s": round(status.last_pass_s, 3),
        "verdicts_age_s": round(now - status.last_pass_at, 3) if status.last_pass_at is not None else None,
        "nodes": status.nodes,
        "jobs": status.jobs,
        # None while the database takes every write; else why not (history is held in memory).
        "storage_problem": status.storage_problem,
        # Where the status page links to (monitor/web/page_links.py).
        "links": page_links(request.app.state.settings),
    }


# The answer to ``?job=ID`` for an ID the monitor does not know: still a /diagnose answer (no
# jobs, the monitor's state), with ``detail`` saying why and ``job`` echoing what was asked, so a
# client tells it from a 404 of a wrong path (FastAPI's ``{"detail": "Not Found"}``).
UNKNOWN_JOB_RESPONSE = {404: {"description": "no job of that id (nor alias): `detail` says so, `jobs` is empty; "
                                             "the text form is one line"}}


@router.get("/diagnose", responses=UNKNOWN_JOB_RESPONSE)
async def get_diagnose(
    request: Request,
    monitor: MonitorDep,
    format: Literal["text", "json"] = "text",
    job: str | None = None,
    view: Literal["full", "summary"] = "full",
    problems: bool = False,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int | None, Query(ge=1)] = None,
    ranks_offset: Annotated[int, Query(ge=0, description="page through each job's ranks, in rank order")] = 0,
    ranks_limit: Annotated[int | None, Query(
        ge=1, le=RANKS_LIMIT_MAX,
        description=f"ranks listed per job; by default all up to {RANKS_LISTED_BY_DEFAULT}, and past that the "
                    "culprits first, then the lowest ranks")] = None,
) -> Response:
    now = monitor.clock()
    results = monitor.results(now, job_id=job)
    status = monitor_status(request, monitor)
    headers = {"Cache-Control": "no-store"}
    if job is not None and not results:
        return _unknown_job(job, format, status, headers)
    chosen, total = select(results, problems, offset, limit)
    cache = request.app.state.answers
    cache.forget_missing(monitor.job_ids())
    if format == "json":
        pieces = []
        step_started = time.perf_counter()
        paged = ranks_offset != 0 or ranks_limit is not None
        for result in chosen:
            if view == "summary":
                pieces.append(cache.job_bytes(result, view))
            elif paged:  # a page of ranks: made for this request, not cached
                pieces.append(await _render(result, partial(_page_bytes, result, ranks_offset, ranks_limit)))
            else:
                pieces.append(await _render(result, partial(cache.job_bytes, result, view)))
            if time.perf_counter() - step_started >= STEP_S:
                await asyncio.sleep(0)
                step_started = time.perf_counter()
        return Response(answer_bytes(pieces, total, status), media_type="application/json", headers=headers)
    # Text is for a person: built from the same data, not cached.
    if view == "summary":
        summaries = [summary_dict(r) for r in chosen]
        return _text_answer(render_monitor_status(status) + render_summary_text(summaries), headers)
    jobs = [await _render(r, partial(job_dict, r, ranks_offset, ranks_limit)) for r in chosen]
    return _text_answer(render_monitor_status(status) + render_text(jobs, now), headers)


def _page_bytes(result: JobResult, ranks_offset: int, ranks_limit: int | None) -> bytes:
    return dumps(job_dict(result, ranks_offset, ranks_limit))


async def _render(result: JobResult, render: Callable[[], T]) -> T:
    """``render()`` of a job's answer: on a worker thread for a giant job (its stack tree and groups
    span every rank), so the event loop goes on taking reports meanwhile; right here otherwise."""
    if len(result.view.ranks) > GIANT_JOB_RANKS:
        return await asyncio.to_thread(render)
    return render()


def _unknown_job(job: str, format: str, status: dict[str, Any], headers: dict[str, str]) -> Response:
    """404 for ``?job=`` naming no job this monitor holds (a job filtered out by ``problems`` or
    paged past is known: 200 with no jobs)."""
    detail = f"no job {job!r}"
    if format == "json":
        body = {"detail": detail, "job": job, "jobs": [], "total_jobs": 0, "monitor": status}
        return Response(dumps(body), status_code=404, media_type="application/json", headers=headers)
    return _text_answer(f"hangwatch: {detail}\n", headers, status_code=404)


def _text_answer(text: str, headers: dict[str, str], status_code: int = 200) -> PlainTextResponse:
    # The renderers escape each string from the monitored processes; this last pass makes sure
    # no control character at all reaches the reader's terminal, whatever a renderer forgot.
    return PlainTextResponse(text_block(text), status_code=status_code, headers=headers)


def render_summary_text(jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return "hangwatch: no jobs\n"
    lines = []
    for j in jobs:
        culprits = f" culprits {','.join(str(r) for r in j['culprit_ranks'])}" if j["culprit_ranks"] else ""
        lines.append(f"{one_line(j['job_id'])}  {one_line(j['verdict'].upper())}{culprits}  "
                     f"{j['ranks_seen']}/{j['world_size']} ranks  {one_line(j['summary'])}")
    return "\n".join(lines) + "\n"


@router.get("/api/v1/jobs/{job_id:job_id}/history")
async def get_history(job_id: str, monitor: MonitorDep) -> JSONResponse:
    # The actions taken (or not) on its incidents ride along: monitor/engine/actions/, routes/actions.py.
    resolved = monitor.resolve(job_id)
    return JSONResponse({"job_id": job_id, "history": await _history(job_id, monitor),
                         "actions": await job_actions(monitor, resolved),
                         "captures": job_captures(monitor, resolved)})


async def _history(job_id: str, monitor: Monitor) -> list[dict[str, Any]]:
    # A database read (after queued writes land): off the event loop, of the id resolved on it.
    changes = await run_in_threadpool(monitor.store.verdict_history, monitor.resolve(job_id))
    if not changes and not monitor.knows_job(job_id):
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return [{"at": c.at, "verdict": c.verdict, "culprit_ranks": list(c.culprit_ranks), "summary": c.summary}
            for c in changes]


@router.get("/api/v1/jobs/{job_id:job_id}/timeline")
async def get_timeline(
    job_id: str, monitor: MonitorDep,
    limit: Annotated[int, Query(ge=0, le=TIMELINE_LIMIT_MAX,
                                description="ranks listed one by one at most, culprits first; 0: only the groups")] = 64,
    rows: Annotated[int, Query(ge=1, le=TIMELINE_ROWS_MAX,
                               description="groups of alike ranks at most, culprits first")] = ROWS_SHOWN,
    lines: Annotated[int, Query(ge=1, le=TIMELINE_ROWS_MAX,
                                description="progress groups at most, culprits first")] = LINES_SHOWN,
) -> Response:
    now = monitor.clock()
    results = monitor.results(now, job_id=job_id)
    if not results:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    # Grouping reads every rank: a giant job's on a worker thread, the loop goes on taking reports.
    timeline = await _render(results[0], partial(_timeline, results[0], monitor, now, limit, rows, lines))
    return Response(await run_in_threadpool(dumps, {"job_id": job_id, **timeline}), media_type="application/json")


def _timeline(result: JobResult, monitor: Monitor, now: float, limit: int | None = None,
              rows: int | None = None, lines: int | None = None) -> dict[str, Any]:
    """The states over the last ``window_s`` seconds, as ``[start, end, state]`` spans oldest first:
    ``ranks`` one by one (at most ``limit``: the culprits, then the lowest ranks), ``groups`` of ranks
    whose states changed alike (at most ``rows``) and ``progress_groups`` of ranks whose steps went
    alike (at most ``lines``): what the page draws. Without limits, every rank and group."""
    culprits = result.diagnosis.culprit_ranks
    timeline = monitor.rank_timeline(result.view.job_id, now)
    listed = culprits_first([rank for rank, _ in timeline.spans], culprits, limit)
    return {
        "now": timeline.now,
        "window_s": timeline.window_s,
        "ranks_total": timeline.ranks_total,
        "ranks": [{"rank": rank, "spans": [list(span) for span in spans]}
                  for rank, spans in timeline.spans if listed is None or rank in listed],
        **span_groups_dict(span_groups(timeline.spans, culprits), rows),
        **progress_groups_dict(_progress_groups(result), lines),
    }


def _progress_groups(result: JobResult) -> list[ProgressGroup]:
    """The job's ranks grouped by progress at its diagnosis' time: made once per diagnosis, for
    every page that shows the job (kept on the result, read-only from then on)."""
    kept = result.__dict__.get("progress_groups")
    if kept is None:
        view = result.view
        kept = result.__dict__["progress_groups"] = progress_groups(
            ((r.rank, r.progress_points or result.job_progress_points, r.alive) for r in view.ranks),
            result.diagnosis.culprit_ranks, view.now)
    return kept  # type: ignore[no-any-return]


@router.get("/api/v1/jobs/{job_id:job_id}/evidence")
async def get_evidence(request: Request, job_id: str, monitor: MonitorDep) -> Response:
    """Everything the monitor holds on one job, as a file to attach to a ticket: the job as
    ``/diagnose?format=json`` shows it (merged stacks included), its verdict history, its ranks'
    state timeline and the monitor's own state."""
    now = monitor.clock()
    results = monitor.results(now, job_id=job_id)
    if not results:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    result = results[0]
    evidence = {
        "saved_at": now,
        # Every rank, whatever the job's size: this is the record that outlives the job.
        "job": await asyncio.to_thread(job_dict, result, 0, max(1, len(result.view.ranks))),
        "history": await _history(job_id, monitor),
        "actions": await job_actions(monitor, result.view.job_id),
        "rank_timeline": await _render(result, partial(_timeline, result, monitor, now)),
        "monitor": monitor_status(request, monitor),
    }
    name = f"hangwatch-evidence-{_file_safe(result.view.job_id)}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}.json"
    return Response(await asyncio.to_thread(dumps, evidence), media_type="application/json",
                    headers={"Cache-Control": "no-store", "Content-Disposition": f'attachment; filename="{name}"'})


def _file_safe(job_id: str) -> str:
    """The job id as a file name part: ids come from the jobs (``host:port``, Slurm ids, anything)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", job_id)[:80].strip("._") or "job"
