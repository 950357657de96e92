"""``GET /api/v1/nodes/suspects``: nodes ranked by the distinct jobs whose incidents named them
as culprits within a window (monitor/engine/incidents.py): the machines to look at, or drain, first."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from monitor.engine.incidents import SuspectNode
from monitor.web.routes.deps import MonitorDep

router = APIRouter()
DAY_S = 86400.0


@router.get("/api/v1/nodes/suspects")
async def get_suspect_nodes(
    monitor: MonitorDep,
    window_s: Annotated[float, Query(gt=0, le=366 * DAY_S, description="how far back incidents count")] = 7 * DAY_S,
    limit: Annotated[int, Query(ge=1, le=10_000, description="nodes listed at most, most jobs first")] = 100,
) -> JSONResponse:
    # A database read (after queued writes land): off the event loop.
    suspects = await run_in_threadpool(monitor.suspect_nodes, window_s)
    return JSONResponse({"window_s": window_s, "now": monitor.clock(), "nodes_total": len(suspects),
                         "nodes": [suspect_dict(s) for s in suspects[:limit]]})


def suspect_dict(suspect: SuspectNode) -> dict[str, Any]:
    return {"node": suspect.node, "jobs": suspect.jobs, "jobs_total": len(suspect.jobs),
            "incidents": suspect.incidents, "verdicts": suspect.verdicts, "last_at": suspect.last_at}
