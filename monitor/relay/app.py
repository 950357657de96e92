"""The relay's ASGI app: agents' reports in (checked as the monitor checks them), batches out; with a
``Summariser`` (``--summarise``), giant jobs' reports kept here and their summary sent once a second.

Paths: ``POST /api/v1/reports`` (agents), ``POST /api/v1/capture-uploads/...`` (agents' evidence,
passed to the monitor as it came, token and all), ``/healthz``, ``/readyz``, ``/metrics``. Anything
else is a 404 that says where the monitor is: people read the monitor, never a relay.

A relay is ready while the monitor behind it answers its ``/healthz``: a relay cut off from the
monitor (a partition, a wrong address or certificate) is taken out of its Service, and agents
reach another one. The monitor's own readiness is not asked: a monitor that is not ready (a
rebuild after a restart, a full volume) still wants every report.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator

from hangwatch_common.http_client import httpx
import orjson
import pydantic
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hangwatch_common.sdnotify import Notifier
from monitor.web.auth import BOUND_NODE_KEY, CAPTURE_UPLOAD_PREFIX, INGEST_PATH, SUMMARY_PATH
from monitor.storage.capture_store import MAX_PART_BYTES
from monitor.ingest.fastwire import decode_for_forwarding, encode_report
from monitor.relay.forwarder import Forwarder, Outcome, monitor_down
from monitor.relay.summariser import Summariser, merge_answer
from monitor.web.routes.ingest import Answer, Disconnected, Message, Receive, Scope, Send, receive_body, \
    refuse_invalid, wrong_node

# The one shape of an agent's capture upload (monitor/engine/capture_requests.py): anything else is not passed on.
UPLOAD_PATH = re.compile(re.escape(CAPTURE_UPLOAD_PREFIX) + r"[A-Za-z0-9_.:\-]{1,200}/[A-Za-z0-9_.:\-]{1,128}")
# Seconds from a report's arrival to its answer: the batch's wait (FLUSH_S) plus the monitor's work.
UPLOAD_TIMEOUT_S = 60.0
# What the relay itself refuses, by the monitor's reason names (hangwatch_reports_rejected_total).
REFUSALS = ("unauthorized", "content_type", "too_large", "invalid_json", "schema", "wrong_node", "disconnected")
ANSWER_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# /readyz asks the monitor at most this often (probes in between get the last answer), waiting this long.
READY_CHECK_EVERY_S = 2.0
READY_TIMEOUT_S = 2.0
# The owner's answer to a summary, at most; the next one is built after it (one in flight at a time).
SUMMARY_TIMEOUT_S = 5.0
# What became of each summary: taken by the owner, refused by it (4xx: fix the relay or the owner's
# settings), failed (unreachable, 5xx, or the relay's own fault).
SUMMARY_OUTCOMES = ("sent", "refused", "failed")
SUMMARY_BUILD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

log = logging.getLogger("hangwatch.relay")


class RelayApp:
    def __init__(self, forwarder: Forwarder, *, max_body_bytes: int, summariser: Summariser | None = None,
                 summary_interval_s: float = 1.0) -> None:
        self.forwarder, self.max_body_bytes = forwarder, max_body_bytes
        self.summariser, self.summary_interval_s = summariser, summary_interval_s
        self.summaries: dict[str, int] = dict.fromkeys(SUMMARY_OUTCOMES, 0)
        self.summary_bytes = 0
        self._summary_problem: str | None = None
        # Refused here, never sent on: by reason, as the monitor counts its own refusals.
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        self.registry = CollectorRegistry(auto_describe=True)
        self.answer_seconds = Histogram("hangwatch_relay_answer_seconds", "From a report's arrival at the relay to "
                                        "its answer", buckets=ANSWER_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram("hangwatch_relay_batch_seconds", "A batch's round trip to the monitor",
                                       buckets=ANSWER_BUCKETS, registry=self.registry)
        forwarder.on_batch = self.batch_seconds.observe
        self.summary_build_seconds = Histogram("hangwatch_relay_summary_build_seconds", "Building and encoding "
                                               "one summary (a worker thread)", buckets=SUMMARY_BUILD_BUCKETS,
                                               registry=self.registry) if summariser is not None else None
        if summariser is not None:
            summariser.on_refused = self.reject
        self.registry.register(_Counts(self))
        # The last readiness check: (loop time, why not ready or None); one check at a time.
        self._readiness: tuple[float, str | None] | None = None
        self._readiness_lock: asyncio.Lock | None = None

    def reject(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            await _answer(send, 200, b"ok\n", b"text/plain; charset=utf-8")
        elif path == "/readyz":
            why = await self._not_ready()
            reasons = [] if why is None else [{"reason": "monitor_unreachable", "detail": why}]
            await _answer_json(send, Outcome(200 if why is None else 503, {"ready": why is None, "reasons": reasons},
                                             {"cache-control": "no-store"}))
        elif path == "/metrics":
            await _answer(send, 200, generate_latest(self.registry), b"text/plain; version=0.0.4; charset=utf-8")
        elif path == INGEST_PATH and method != "POST":
            await _answer_json(send, Outcome(405, {"detail": "Method Not Allowed"}, {"allow": "POST"}))
        elif path == INGEST_PATH:
            started = time.monotonic()
            try:
                outcome = await self._relay_report(scope, receive)
            except Answer as refusal:
                outcome = Outcome(refusal.status, refusal.body, {k.decode(): v.decode() for k, v in refusal.headers})
            except Disconnected:
                return
            await _answer_json(send, outcome)
            self.answer_seconds.observe(time.monotonic() - started)
        elif UPLOAD_PATH.fullmatch(path) and method == "POST":
            await _answer_json(send, await self._pass_upload(scope, receive))
        else:
            await _answer_json(send, Outcome(404, {"detail": f"a hangwatch relay takes agents' reports only: read "
                                                             f"the monitor at {self.forwarder.owner}"}))

    async def _not_ready(self) -> str | None:
        """Why the relay is not ready (the monitor does not answer its /healthz), None when it is."""
        if self._readiness_lock is None:
            self._readiness_lock = asyncio.Lock()
        async with self._readiness_lock:  # probes that come together share one check
            now = asyncio.get_running_loop().time()
            if self._readiness is None or now - self._readiness[0] >= READY_CHECK_EVERY_S:
                owner = self.forwarder.owner
                try:
                    response = await self.forwarder.client.get(owner + "/healthz", timeout=READY_TIMEOUT_S)
                    why = None if response.status_code == 200 else \
                        f"the monitor at {owner} answered /healthz with HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    why = f"the monitor at {owner} is unreachable ({type(exc).__name__})"
                self._readiness = (asyncio.get_running_loop().time(), why)
            return self._readiness[1]

    async def _relay_report(self, scope: Scope, receive: Receive) -> Outcome:
        body = await receive_body(scope, receive, self.max_body_bytes, self.reject)
        try:
            report, forwarded = decode_for_forwarding(body)
        except pydantic.ValidationError as exc:
            raise refuse_invalid(exc, self.reject) from None
        bound_node = scope.get(BOUND_NODE_KEY)
        if bound_node is not None and report.node != bound_node:
            self.reject("wrong_node")
            raise wrong_node(bound_node)
        if len(forwarded) > self.max_body_bytes:  # lax input, encoded again in full, can grow
            self.reject("too_large")
            raise Answer(413, {"accepted": False, "detail": f"report is larger than the limit of "
                                                            f"{self.max_body_bytes} bytes once encoded"})
        attributed = bound_node is not None
        if self.summariser is None:
            return await self.forwarder.forward(forwarded, attributed=attributed)
        taken = self.summariser.take(report, attributed)
        if taken.answer is not None:  # giant jobs' ranks only: they reach the owner in the summary
            return Outcome(202, taken.answer)
        encoded = forwarded if taken.forward is report else encode_report(taken.forward)
        outcome = await self.forwarder.forward(encoded, attributed=attributed)
        if outcome.status != 202:  # not applied here either: the agent sends it again, or a newer one
            return outcome
        return Outcome(202, merge_answer(outcome.body, self.summariser.apply(taken, attributed)), outcome.headers)

    async def _summarise_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self._send_summary()
            await asyncio.sleep(max(0.0, started + self.summary_interval_s - loop.time()))

    async def _send_summary(self) -> None:
        """Build the summary on a worker thread (the loop keeps answering agents), post it to the owner."""
        assert self.summariser is not None and self.summary_build_seconds is not None
        owner = self.forwarder.owner
        try:
            started = time.monotonic()
            body = await asyncio.to_thread(self.summariser.summary_body)
            self.summary_build_seconds.observe(time.monotonic() - started)
        except Exception:  # the relay's own fault: said, counted, and the next second tries again
            log.exception("building a summary failed")
            self.summaries["failed"] += 1
            return
        if body is None:
            return
        self.summary_bytes = len(body)
        headers = {"content-type": "application/json"}
        token = self.forwarder.token()
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            response = await self.forwarder.client.post(owner + SUMMARY_PATH, content=body, headers=headers,
                                                        timeout=SUMMARY_TIMEOUT_S)
        except httpx.HTTPError as exc:
            self._summary_failed("failed", f"the monitor at {owner} is unreachable ({type(exc).__name__})")
            return
        if response.status_code not in (200, 202):
            self._summary_failed("refused" if 400 <= response.status_code < 500 else "failed",
                                 f"the monitor at {owner} answered a summary with HTTP {response.status_code}: "
                                 f"{response.text[:200]}")
            return
        try:
            answer = orjson.loads(response.content)
            hosts_full, detail = answer.get("hosts_full") is True, answer.get("detail")
        except (orjson.JSONDecodeError, AttributeError):
            hosts_full, detail = True, None  # an answer not understood: every host's facts again cannot be wrong
        self.summariser.answered(hosts_full, detail)
        self.summaries["sent"] += 1
        if self._summary_problem is not None:
            log.warning("the monitor at %s takes summaries again", owner)
            self._summary_problem = None

    def _summary_failed(self, outcome: str, why: str) -> None:
        self.summaries[outcome] += 1
        if self._summary_problem != why:  # once per distinct problem, not once a second
            log.error("%s; the next summary tries again", why)
            self._summary_problem = why

    async def _pass_upload(self, scope: Scope, receive: Receive) -> Outcome:
        """An agent's part of an evidence capture, to the monitor with the agent's own token."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return Outcome(400, {"detail": "upload cut off"})
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_PART_BYTES:
                return Outcome(413, {"detail": f"a capture part is at most {MAX_PART_BYTES} bytes"})
            if not message.get("more_body", False):
                break
        passed = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                  if k in (b"authorization", b"content-type", b"content-encoding")}
        try:
            response = await self.forwarder.client.post(self.forwarder.owner + scope["path"], content=b"".join(chunks),
                                                        headers=passed, timeout=UPLOAD_TIMEOUT_S)
            return Outcome(response.status_code, orjson.loads(response.content))
        except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
            return monitor_down(f"relay: the monitor at {self.forwarder.owner} did not take the upload "
                                f"({type(exc).__name__})")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        # Under systemd (Type=notify): READY=1 once serving, WATCHDOG=1 from the event loop.
        notifier = Notifier.from_env()
        watchdog: asyncio.Task[None] | None = None
        summarising: asyncio.Task[None] | None = None
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                if notifier.enabled:
                    watchdog = asyncio.create_task(_feed(notifier))
                    notifier.ready(f"relaying to {self.forwarder.owner}")
                if self.summariser is not None:
                    summarising = asyncio.create_task(self._summarise_forever())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                notifier.stopping()
                if watchdog is not None:
                    watchdog.cancel()
                if summarising is not None:
                    summarising.cancel()
                await self.forwarder.close()
                if self.summariser is not None:
                    self.summariser.close()
                notifier.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


class _Counts:
    """The relay's counters, read from the app and its forwarder at each scrape."""

    def __init__(self, app: RelayApp) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        forwarder = self.app.forwarder
        reports = CounterMetricFamily("hangwatch_relay_reports", "Agents' reports by what became of them: answered "
                                      "(by the monitor, taken or refused there), monitor_unreachable, shed (too "
                                      "many waiting), refused here (reason: schema, too_large, ...)",
                                      labels=["outcome", "reason"])
        for outcome, count in sorted(forwarder.reports.items()):
            reports.add_metric([outcome, ""], count)
        for reason, count in sorted(self.app.refused.items()):
            reports.add_metric(["refused", reason], count)
        yield reports
        yield CounterMetricFamily("hangwatch_relay_batches", "Batches sent to the monitor", value=forwarder.batches)
        yield GaugeMetricFamily("hangwatch_relay_waiting_reports", "Reports waiting for the next batch",
                                value=forwarder.waiting)
        if self.app.summariser is not None:
            summaries = CounterMetricFamily("hangwatch_relay_summaries", "Summaries of giant jobs posted to the "
                                            "monitor, by outcome: sent (taken), refused (4xx), failed",
                                            labels=["outcome"])
            for outcome, count in sorted(self.app.summaries.items()):
                summaries.add_metric([outcome], count)
            yield summaries
            yield GaugeMetricFamily("hangwatch_relay_summary_bytes", "The last summary's size",
                                    value=self.app.summary_bytes)


async def _feed(notifier: Notifier) -> None:
    while True:  # a wedged loop stops the pings, and systemd restarts the relay
        notifier.tick()
        await asyncio.sleep(0.5)


async def _answer_json(send: Send, outcome: Outcome) -> None:
    await _answer(send, outcome.status, orjson.dumps(outcome.body), b"application/json",
                  [(k.encode("latin-1"), v.encode("latin-1")) for k, v in outcome.headers.items()])


async def _answer(send: Send, status: int, body: bytes, content_type: bytes,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
