"""``GET /metrics``: a plain route, not a mounted app (a mount answers /metrics with a redirect)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from monitor.metrics import render_metrics
from monitor.routes.deps import MonitorDep

router = APIRouter()


@router.get("/metrics")
async def get_metrics(request: Request, monitor: MonitorDep) -> Response:
    # Rendered on a worker thread: ~150,000 series at 10,000 ranks must not hold up ingest.
    body = await run_in_threadpool(render_metrics, monitor, request.app.state.load_guard,
                                   request.app.state.http_stats)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
