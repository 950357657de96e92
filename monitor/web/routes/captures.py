"""Evidence captures (monitor/storage/capture_store.py): agents upload their part of a bundle
(``POST /api/v1/capture-uploads/BUNDLE/NODE``, an agent's token, streamed to disk); people list
them (``GET /api/v1/captures``, ``?job=``; also on the job's history answer) and download one
as a tar (``GET /api/v1/captures/BUNDLE``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from monitor.web.auth import BOUND_NODE_KEY
from monitor.engine.capture_requests import UPLOAD_PREFIX
from monitor.storage.capture_store import BUNDLE_ID, CaptureRefused
from monitor.web.routes.deps import MonitorDep
from monitor.engine.service import Monitor

router = APIRouter()


@router.post(UPLOAD_PREFIX + "{bundle_id}/{node}", status_code=201)
async def upload_part(bundle_id: str, node: str, request: Request, monitor: MonitorDep) -> JSONResponse:
    captures = monitor.captures
    if captures is None:
        raise HTTPException(status_code=404, detail="captures are off on this monitor (--capture-after 0)")
    bound = request.scope.get(BOUND_NODE_KEY)
    if bound is not None and bound != node:
        # A node-bound token: a node uploads its own part only (monitor/web/auth.py).
        raise HTTPException(status_code=403, detail=f"this token may only upload for node {bound!r}")
    if request.headers.get("content-encoding", "").lower() != "gzip":
        raise HTTPException(status_code=415, detail="a capture part is gzipped JSON (Content-Encoding: gzip)")
    try:
        size = await captures.store.receive_part(bundle_id, node, request.stream())
    except CaptureRefused as refused:
        raise HTTPException(status_code=refused.status, detail=refused.detail) from None
    return JSONResponse({"bundle": bundle_id, "node": node, "bytes": size}, status_code=201)


@router.get("/api/v1/captures")
async def list_captures(
    monitor: MonitorDep,
    job: Annotated[str | None, Query(max_length=256, description="one job's bundles only")] = None,
) -> JSONResponse:
    captures = monitor.captures
    if captures is None:
        return JSONResponse({"enabled": False, "captures": []})
    return JSONResponse({"enabled": True, "after_s": captures.after_s, "captures": job_captures(monitor, job)})


def job_captures(monitor: Monitor, job_id: str | None) -> list[dict]:
    return monitor.captures.store.bundles(job_id) if monitor.captures is not None else []


@router.get("/api/v1/captures/{bundle_id}")
async def download(bundle_id: str, monitor: MonitorDep) -> StreamingResponse:
    captures = monitor.captures
    if captures is None or not BUNDLE_ID.match(bundle_id) or captures.store.get(bundle_id) is None:
        raise HTTPException(status_code=404, detail=f"no capture {bundle_id!r}")
    return StreamingResponse(captures.store.tar_stream(bundle_id), media_type="application/x-tar",
                             headers={"Cache-Control": "no-store",
                                      "Content-Disposition": f'attachment; filename="hangwatch-capture-{bundle_id}.tar"'})
