"""``POST /api/v1/reports``: an agent's report in; nothing changes unless all of it is valid."""

from __future__ import annotations

import time
from typing import Any

import pydantic
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from monitor.routes.deps import MonitorDep, SettingsDep
from monitor.fastwire import decode_report
from monitor.load import peek_node

router = APIRouter()

MAX_ERRORS_SHOWN = 10


@router.post("/api/v1/reports", status_code=202)
async def post_report(request: Request, monitor: MonitorDep, settings: SettingsDep) -> JSONResponse:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        monitor.reject("content_type")
        return _refuse(415, f"content-type must be application/json, not {content_type or 'missing'!r}")

    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            too_big = int(declared) > limit
        except ValueError:
            monitor.reject("invalid_json")
            return _refuse(400, "content-length is not a number")
        if too_big:
            monitor.reject("too_large")
            return _refuse(413, f"report is larger than the limit of {limit} bytes")
    # Content-Length may be absent (chunked) or lie: count what actually arrives.
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                monitor.reject("too_large")
                return _refuse(413, f"report is larger than the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # The agent gave up (its timeout) before sending it all: nobody is left to answer,
        # and a traceback per dropped post would cost a busy monitor more than the post did.
        monitor.reject("disconnected")
        return Response(status_code=499)
    body = b"".join(chunks)

    guard = request.app.state.load_guard
    if guard.should_shed(peek_node(body), time.monotonic()):
        # Past capacity: this node reported moments ago, its next report will do.
        return JSONResponse(
            {"accepted": False, "detail": "monitor overloaded: send the newest report later"},
            status_code=503,
            headers={"Retry-After": str(max(1, round(guard.shed_keep_s / 2)))},
        )

    try:
        report = decode_report(body)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            monitor.reject("invalid_json")
            return _refuse(422, f"body is not valid JSON: {errors[0]['msg']}")
        monitor.reject("schema")
        return _refuse(422, _describe(errors), errors=[_error(e) for e in errors[:MAX_ERRORS_SHOWN]])

    answer = monitor.ingest(report, body)
    guard.accepted(report.node, time.monotonic())
    # "delta": this monitor takes delta reports (agent/delta.py); "send_full": make the next one full.
    return JSONResponse(
        {"accepted": True, "ranks": len(report.ranks), "delta": True, "send_full": answer.send_full}, status_code=202
    )


def _refuse(status: int, detail: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"accepted": False, "detail": detail, **extra}, status_code=status)


def _loc(error: dict[str, Any]) -> str:
    return ".".join(str(p) for p in error["loc"]) or "(body)"


def _error(error: dict[str, Any]) -> dict[str, str]:
    return {"field": _loc(error), "message": error["msg"]}


def _describe(errors: list[Any]) -> str:
    first = "; ".join(f"{_loc(e)}: {e['msg']}" for e in errors[:3])
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"report does not match the schema: {first}{more}"
