"""``GET /diagnose`` (text or JSON) and a job's verdict history."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from monitor.present import diagnose_dict
from monitor.render_text import render_text
from monitor.routes.deps import MonitorDep

router = APIRouter()


@router.get("/diagnose")
async def get_diagnose(
    monitor: MonitorDep, format: Literal["text", "json"] = "text", job: str | None = None
) -> Response:
    now = monitor.clock()
    # Routes, ingest and the tick all run on the event loop: the state is not changing under us.
    data = diagnose_dict(monitor.results(now, job_id=job), monitor.state.jobs)
    if format == "json":
        return JSONResponse(data, headers={"Cache-Control": "no-store"})
    text = render_text(data["jobs"], now)
    if job is not None and not data["jobs"]:
        text = f"hangwatch: no job {job!r}\n"
    return PlainTextResponse(text, headers={"Cache-Control": "no-store"})


@router.get("/api/v1/jobs/{job_id}/history")
async def get_history(job_id: str, monitor: MonitorDep) -> JSONResponse:
    # A database read (after queued writes land): keep it off the event loop.
    changes = await run_in_threadpool(monitor.history, job_id)
    if not changes and not monitor.knows_job(job_id):
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return JSONResponse(
        {
            "job_id": job_id,
            "history": [
                {"at": c.at, "verdict": c.verdict, "culprit_ranks": list(c.culprit_ranks), "summary": c.summary}
                for c in changes
            ],
        }
    )
