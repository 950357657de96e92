"""``GET /api/v1/actions``: the audit log of opt-in actions (monitor/engine/actions/), newest last: every
decision a rule made about an incident (ran, failed, dry run, or not taken and why)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from monitor.web.routes.deps import MonitorDep
from monitor.engine.service import Monitor

router = APIRouter()


@router.get("/api/v1/actions")
async def get_actions(
    monitor: MonitorDep,
    job: Annotated[str | None, Query(max_length=256, description="one job's entries only")] = None,
    limit: Annotated[int, Query(ge=1, le=5000, description="entries at most, the newest")] = 200,
) -> JSONResponse:
    engine = monitor.actions
    if engine is None:
        return JSONResponse({"enabled": False, "dry_run": None, "actions": []})
    return JSONResponse({"enabled": True, "dry_run": engine.config.dry_run,
                         "rules": [{"name": r.name, "kind": r.kind, "verdicts": sorted(r.verdicts),
                                    "after_s": r.after_s, "target": r.target} for r in engine.config.rules],
                         "actions": await job_actions(monitor, job, limit)})


async def job_actions(monitor: Monitor, job_id: str | None, limit: int = 200) -> list[dict[str, Any]]:
    """The audit entries of one job (or all), as JSON; none when actions are off."""
    engine = monitor.actions
    if engine is None:
        return []
    # A database read (after queued writes land): off the event loop.
    records = await run_in_threadpool(engine.audit, job_id, limit)
    return [engine.as_json(r) for r in records]
