"""``POST /api/v1/summaries``: a summarising relay's summary of its nodes' giant jobs, once a second
(monitor/ingest/summary_wire.py; docs/scaling.md, "One job of 100,000 ranks").

A summary speaks for thousands of ranks, so only a relay may send one: where the monitor has tokens,
the relay token (``--relay-token-file``), never an agent's. It is refused whole (422, the reason
said) when anything in it fails the checks of monitor/engine/summaries.py, and nothing changes then.
"""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from monitor.ingest.summary_wire import decode_summary
from monitor.web.auth import RELAY_KEY, SUMMARY_PATH
from monitor.web.routes.deps import MonitorDep, SettingsDep

router = APIRouter()
# A relay's share of 100,000 ranks (16 relays) is ~1-2 MB; this leaves room and bounds a bad one.
MAX_SUMMARY_BYTES = 64 * 1024 * 1024


_ANSWERS = {202: {"description": "kept"}, 401: {"description": "no token"},
            403: {"description": "not a relay's token"}, 413: {"description": "too large"},
            415: {"description": "not JSON"}, 422: {"description": "not a summary, or one that fails the checks"}}
_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}}


@router.post(SUMMARY_PATH, status_code=202, responses=_ANSWERS, openapi_extra=_BODY)
async def post_summary(request: Request, monitor: MonitorDep, settings: SettingsDep) -> JSONResponse:
    guarded = settings.token_file is not None or settings.relay_token_file is not None
    if guarded and not request.scope.get(RELAY_KEY):
        return JSONResponse({"accepted": False, "detail": "a summary needs a relay token (--relay-token-file): an "
                                                          "agent's token speaks for its own node only"}, 403)
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return JSONResponse({"accepted": False, "detail": "content-type must be application/json"}, 415)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_SUMMARY_BYTES:
            return JSONResponse({"accepted": False, "detail": f"a summary is at most {MAX_SUMMARY_BYTES} bytes"}, 413)
        chunks.append(chunk)
    try:
        summary = decode_summary(b"".join(chunks))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return JSONResponse({"accepted": False, "detail": f"not a summary: {exc}"[:1000]}, 422)
    try:
        answer = monitor.ingest_summary(summary)
    except ValueError as exc:
        return JSONResponse({"accepted": False, "detail": str(exc)[:1000]}, 422)
    out = {"accepted": True, "jobs": answer.jobs, "hosts_full": answer.hosts_full}
    if answer.detail:
        out["detail"] = answer.detail  # ranks to send whole (summary_wire.detail_request)
    return JSONResponse(out, 202)
