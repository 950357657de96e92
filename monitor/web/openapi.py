"""The monitor's OpenAPI schema, with the ingest paths that FastAPI cannot see.

Reports are answered by a plain ASGI layer in front of FastAPI (monitor/web/routes/ingest.py), so
FastAPI's own schema lacks ``POST /api/v1/reports``: the one endpoint agent authors, fuzzers and
client generators need most. The body's schema comes from the wire model itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hangwatch_common.version import version
from monitor.ingest.wire import Report

INGEST = "/api/v1/reports"
BATCHES = "/api/v1/report-batches"
# Every answer the ingest layer gives by design (401/403 only with token files, 503 only when shedding).
INGEST_ANSWERS = {
    "202": "accepted; the answer says whether the monitor takes deltas and wants a full report",
    "400": "not JSON, or nested too deep",
    "401": "no token, or not one of the monitor's ingest tokens",
    "403": "the token is bound to another node",
    "413": "larger than max_body_bytes (the connection is closed)",
    "415": "content-type is not application/json",
    "422": "does not match the schema, or over a limit (world size, lengths)",
    "429": "over max_jobs, max_jobs_per_node, max_ranks or max_nodes",
    "503": "over capacity: send the newest report after Retry-After",
}


BATCH_ANSWERS = {
    "200": "each report's status and answer, in order: {\"results\": [{\"status\", \"body\", \"headers\"}]}",
    "400": "content-length is not a number",
    "401": "no token, or not one of the monitor's relay tokens (ingest tokens without --relay-token-file)",
    "403": "an ingest token bound to one node",
    "413": "larger than max_body_bytes plus the batch's framing (each report alone past max_body_bytes is a 413 in its own result)",
    "415": "content-type is not application/json",
    "422": "not a batch: {\"reports\": [{\"report\": Report, \"attributed\": bool}]}, 4,096 at most",
}


def with_ingest(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's) with the ingest path and the report's models added, in place."""
    report = Report.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    clash = set(components) & ({"Report"} | set(report.get("$defs", {})))
    if clash:
        raise RuntimeError(f"wire models named like the app's schemas: {sorted(clash)}")
    components.update(report.pop("$defs", {}))
    components["Report"] = report
    answer = {"content": {"application/json": {"schema": {"type": "object"}}}}
    schema["paths"][INGEST] = {"post": {
        "operationId": "post_report",
        "summary": "An agent's report of its node",
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Report"}}}},
        "responses": {status: {"description": text, **answer} for status, text in INGEST_ANSWERS.items()},
    }}
    entry = {"type": "object", "required": ["report"], "properties": {
        "report": {"$ref": "#/components/schemas/Report"}, "attributed": {"type": "boolean", "default": False}}}
    schema["paths"][BATCHES] = {"post": {
        "operationId": "post_report_batch",
        "summary": "A relay's batch of agents' reports (hangwatch-relay), each answered as if posted alone",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["reports"],
            "properties": {"reports": {"type": "array", "maxItems": 4096, "items": entry}}}}}},
        "responses": {status: {"description": text, **answer} for status, text in BATCH_ANSWERS.items()},
    }}
    return schema


def install(app: FastAPI) -> None:
    """Serve the schema with the ingest path (built once, on the first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_ingest(get_openapi(title=app.title, version=version(), routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
