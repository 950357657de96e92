"""``GET /healthz`` (liveness: the process answers) and ``GET /readyz`` (readiness: 200, or 503 with each
reason, monitor/engine/readiness.py). Both are open without a token (monitor/web/auth.py): an
orchestrator's probes carry no secrets, and neither answer says more than /metrics' own health."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from monitor.web.routes.deps import MonitorDep

router = APIRouter()
# A probe's answer is of its moment: never kept by a cache between the prober and the monitor.
NO_STORE = {"Cache-Control": "no-store"}


@router.get("/healthz")
async def get_healthz() -> PlainTextResponse:
    # Constant and cheap: a liveness probe must not fail (and restart the monitor) over what a restart
    # cannot mend, such as a full disk; a wedged event loop answers nothing, which is the failure it needs.
    return PlainTextResponse("ok\n", headers=NO_STORE)


@router.get("/readyz")
async def get_readyz(monitor: MonitorDep) -> JSONResponse:
    readiness = monitor.readiness()
    return JSONResponse(readiness.answer(), status_code=200 if readiness.ready else 503, headers=NO_STORE)
