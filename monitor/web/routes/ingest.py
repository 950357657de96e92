"""``POST /api/v1/reports``: an agent's report in; nothing changes unless all of it is valid.
``POST /api/v1/report-batches``: many agents' reports in one post, from a relay (monitor/relay/).

This is the monitor's hot path (1,250 posts a second at 10,000 ranks), so it is answered by a
plain ASGI layer in front of the FastAPI app rather than by a routed endpoint: the framework's
middleware, routing and dependency injection cost more per post than decoding and applying the
report itself. Every other path goes on to the app.

A batch holds reports a relay has already checked and decoded; each is taken or refused on its
own, exactly as if its agent had posted it here, and the answer lists each one's status and body
in order, for the relay to hand back to the agent that is waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
import pydantic

from monitor.web.auth import BATCH_PATH, BOUND_NODE_KEY, INGEST_PATH, RELAY_KEY
from monitor.ingest.fastwire import MAX_BATCH_REPORTS, decode_batch, decode_report
from monitor.web.load import LoadGuard, peek_node
from monitor.engine.service import IngestAnswer, Monitor
from monitor.web.settings import Settings

PATH = INGEST_PATH
log = logging.getLogger("hangwatch.monitor.ingest")
MAX_ERRORS_SHOWN = 10
# A relay's batch holds at most its max_body_bytes of reports plus the batch's framing
# ('{"attributed":false,"report":' and '},' around each, ~32 bytes): the batch's limit is a single
# report's plus room for that framing. It bounds what one post holds in memory; each report of the
# batch is held to a direct post's limit on its own (fastwire.decode_batch).
BATCH_FRAMING_BYTES = 64 * MAX_BATCH_REPORTS + 64
# Reports of a batch applied between two turns of the event loop (~0.4 ms each).
BATCH_YIELD_EVERY = 32

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Answer(Exception):
    """An early answer to the post (a refusal); raised where the problem is found."""

    def __init__(self, status: int, body: dict[str, Any], headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers


class IngestLayer:
    """Answers ``POST /api/v1/reports``; passes every other request to ``app``."""

    def __init__(self, app: ASGIApp, monitor: Monitor, settings: Settings, guard: LoadGuard) -> None:
        self.app, self.monitor, self.settings, self.guard = app, monitor, settings, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else None
        if path not in (PATH, BATCH_PATH):
            await self.app(scope, receive, send)
            return
        try:
            if scope["method"] != "POST":
                raise Answer(405, {"detail": "Method Not Allowed"}, ((b"allow", b"POST"),))
            if path == PATH:
                answer, status = await self._ingest(scope, receive), 202
            else:
                answer, status = await self._ingest_batch(scope, receive), 200
            headers = ()
        except Answer as refusal:
            answer, status, headers = refusal.body, refusal.status, refusal.headers
        except Disconnected:
            return  # nobody is left to answer
        body = orjson.dumps(answer)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    async def _ingest(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        monitor = self.monitor
        body = await receive_body(scope, receive, self.settings.max_body_bytes, monitor.reject)
        # The node's name is looked for in the body only while the loop is behind (a regex over its head).
        if self.guard.overloaded and self._should_shed(peek_node(body)):
            raise self._shed()
        report = decode_or_refuse(body, monitor.reject)
        bound_node = scope.get(BOUND_NODE_KEY)
        if bound_node is not None and report.node != bound_node:
            # A per-node token (monitor/web/auth.py): one node cannot speak for another.
            monitor.reject("wrong_node")
            raise wrong_node(bound_node)
        return self._answer_owed_delta(report) or self._take(report, attributed=bound_node is not None)

    async def _ingest_batch(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        monitor = self.monitor
        if scope.get(BOUND_NODE_KEY) is not None:
            monitor.reject("wrong_node")
            raise _refuse(403, "a token bound to one node cannot post other nodes' reports")
        body = await receive_body(scope, receive, batch_body_limit(self.settings.max_body_bytes), monitor.reject)
        try:
            batch = decode_batch(body, self.settings.max_body_bytes)
        except ValueError as exc:
            # The relay decoded each report with this monitor's own decoder: a batch that does not
            # decode is a relay of another version (or not a relay), refused whole.
            monitor.reject("schema")
            raise _refuse(422, f"not a batch of reports: {exc}") from None
        # Only a relay's own token vouches for its bound-node checks (monitor/web/auth.py).
        vouched = bool(scope.get(RELAY_KEY))
        results = []
        for index, entry in enumerate(batch):
            if index and index % BATCH_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # reads and other posts get the loop between parts of a large batch
            try:
                if entry.report is None:
                    monitor.reject("too_large")
                    raise too_large(self.settings.max_body_bytes)
                if self._should_shed(entry.report.node):
                    raise self._shed()
                body = (self._answer_owed_delta(entry.report)
                        or self._take(entry.report, attributed=entry.attributed and vouched))
                results.append({"status": 202, "body": body})
            except Answer as refusal:
                headers = {k.decode(): v.decode() for k, v in refusal.headers if k != b"connection"}
                results.append({"status": refusal.status, "body": refusal.body, "headers": headers})
            except Exception:
                # A fault of this monitor's on one report: that one is answered 500 (its agent retries);
                # the others of the batch, some applied already, keep their own answers.
                log.exception("applying a report of a relay's batch failed")
                results.append({"status": 500, "body": {"accepted": False, "detail": "internal error"}})
        return {"results": results}

    def _should_shed(self, node: str | None) -> bool:
        # A node that owes its full report is never shed (Monitor.owes_full): its jobs wait on it.
        if node is None or not self.guard.overloaded or self.monitor.owes_full(node):
            return False
        return self.guard.should_shed(node, time.monotonic())

    def _answer_owed_delta(self, report: Any) -> dict[str, Any] | None:
        """While the loop is behind, a delta from a node that owes its full report is answered (send
        the full one, when) and not applied: what is let in unshed must not cost what it saves."""
        if not self.guard.overloaded:
            return None
        answer = self.monitor.answer_owed_delta(report)
        if answer is None:
            return None
        self.guard.accepted(report.node, time.monotonic())
        return _taken(report, answer)

    def _shed(self) -> Answer:
        # Past capacity: this node reported moments ago, its next report will do.
        return Answer(503, {"accepted": False, "detail": "monitor overloaded: send the newest report later"},
                      ((b"retry-after", str(max(1, round(self.guard.shed_keep_s / 2))).encode()),))

    def _take(self, report: Any, attributed: bool) -> dict[str, Any]:
        """Apply one decoded report: its answer, or the refusal raised as an Answer."""
        monitor = self.monitor
        refusal = monitor.refusal(report)
        if refusal is not None:
            refusal = monitor.make_room(report, refusal)
        refused_jobs: list[str] = []
        if refusal is not None:
            monitor.reject(refusal.reason)
            rest = monitor.without_jobs(report, refusal.excess_jobs) if refusal.excess_jobs else None
            if rest is None or not rest.ranks:
                raise _refuse(refusal.status, refusal.detail)
            # Only the excess is refused: the node's other jobs keep being heard.
            report, refused_jobs = rest, sorted(refusal.excess_jobs)
        answer = monitor.ingest(report, attributed=attributed)
        self.guard.accepted(report.node, time.monotonic())
        out = _taken(report, answer)
        if refused_jobs:
            out["refused_jobs"] = {"jobs": refused_jobs[:64], "detail": refusal.detail if refusal else ""}
        if report.order_results:
            monitor.orders.answered(report.order_results)
        # Orders for this node's agent only (monitor/engine/actions/orders.py): signals to its culprit ranks
        # (opt-in actions), captures of its ranks (monitor/engine/capture_requests.py).
        orders = monitor.orders.take(report.node) if not report.replayed else []
        if orders:
            out["orders"] = orders
        return out


def _taken(report: Any, answer: IngestAnswer) -> dict[str, Any]:
    """The answer to a report taken. "delta": this monitor takes delta reports (agent/delta.py);
    "send_full": make the next one full, "full_in_s" seconds from now (deltas until then: a herd
    spread, monitor/ingest/full_pacing.py); "replay": this monitor applies reports kept through an
    outage at their own times."""
    out = {"accepted": True, "ranks": len(report.ranks), "delta": True, "send_full": answer.send_full, "replay": True}
    if answer.send_full:
        out["full_in_s"] = answer.full_in_s
    return out


def batch_body_limit(max_body_bytes: int) -> int:
    """The largest batch body a monitor with this per-report limit takes."""
    return max_body_bytes + BATCH_FRAMING_BYTES


async def receive_body(scope: Scope, receive: Receive, limit: int, reject: Callable[[str], None]) -> bytes:
    """A report's body after the content-type and size checks; an Answer (415, 400, 413) when they fail."""
    headers = {k: v for k, v in scope["headers"] if k in (b"content-type", b"content-length")}
    content_type = headers.get(b"content-type", b"").decode("latin-1")
    if content_type.split(";")[0].strip().lower() != "application/json":
        reject("content_type")
        raise _refuse(415, f"content-type must be application/json, not {content_type or 'missing'!r}")
    declared = headers.get(b"content-length")
    if declared is not None:
        try:
            too_big = int(declared) > limit
        except ValueError:
            reject("invalid_json")
            raise _refuse(400, "content-length is not a number") from None
        if too_big:
            reject("too_large")
            raise too_large(limit)
    return await _read_body(receive, limit, reject)


def decode_or_refuse(body: bytes, reject: Callable[[str], None]) -> Any:
    """The decoded report (monitor.fastwire), or a 422 Answer saying which fields are wrong."""
    try:
        return decode_report(body)
    except pydantic.ValidationError as exc:
        raise refuse_invalid(exc, reject) from None


def refuse_invalid(exc: pydantic.ValidationError, reject: Callable[[str], None]) -> Answer:
    """The 422 for a body that is not a report: not JSON at all, or which fields are wrong."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    if any(e["type"] == "json_invalid" for e in errors):
        reject("invalid_json")
        return _refuse(422, f"body is not valid JSON: {errors[0]['msg']}")
    reject("schema")
    return _refuse(422, _describe(errors), errors=[_error(e) for e in errors[:MAX_ERRORS_SHOWN]])


def too_large(limit: int) -> Answer:
    return _refuse(413, f"body is larger than the limit of {limit} bytes")


def wrong_node(bound_node: str) -> Answer:
    return _refuse(403, f"this token may only report for node {bound_node!r}")


async def _read_body(receive: Receive, limit: int, reject: Callable[[str], None]) -> bytes:
    # Content-Length may be absent (chunked) or lie: count what actually arrives.
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # The agent gave up (its timeout) before sending it all.
            reject("disconnected")
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            reject("too_large")
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class Disconnected(Exception):
    """The client went away before its body arrived: nobody is left to answer."""


def _refuse(status: int, detail: str, **extra: Any) -> Answer:
    # After a 413 the rest of the body is still on its way: close rather than read it to the end.
    headers = ((b"connection", b"close"),) if status == 413 else ()
    return Answer(status, {"accepted": False, "detail": detail, **extra}, headers)


def _loc(error: dict[str, Any]) -> str:
    return ".".join(str(p) for p in error["loc"]) or "(body)"


def _error(error: dict[str, Any]) -> dict[str, str]:
    return {"field": _loc(error), "message": error["msg"]}


def _describe(errors: list[Any]) -> str:
    first = "; ".join(f"{_loc(e)}: {e['msg']}" for e in errors[:3])
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"report does not match the schema: {first}{more}"
