"""Reports waiting at a relay, sent to the monitor in batches; each waiting agent gets its own answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from hangwatch_common.http_client import httpx
import orjson

from monitor.web.auth import BATCH_PATH

log = logging.getLogger("hangwatch.relay")

# How long the first report of a batch waits for others: an agent's answer comes this much later,
# and the monitor gets at most 1/flush_s posts a second from each relay.
FLUSH_S = 0.05
# Reports in one batch at most: the monitor applies a batch in one go on its event loop, ~0.4 ms a
# report, so a batch of 256 holds it ~0.1 s at most (a batch is this large only when reports queue).
BATCH_REPORTS = 256
# An agent waits 2 s for its answer (agent/sender.py TIMEOUT_S), then sends its newest report again:
# a report that waited longer than this at the relay is answered 503 rather than sent on, since
# nobody waits for it, and the monitor, slow already, would apply it for nothing.
STALE_S = 1.5
# The monitor's answer to a batch, at most (longer than an agent waits: its answer is late anyway).
TIMEOUT_S = 5.0
# Past this many reports, or batches' worth of bytes, waiting (a slow or stalled monitor), new ones
# are turned away at once: the relay's memory stays bounded whatever the monitor does.
MAX_WAITING = 16 * BATCH_REPORTS
MAX_WAITING_BATCHES = 4
# An agent told to come back later spreads its retries over this many seconds and more (agent/sender.py).
RETRY_AFTER_S = 2


@dataclass(frozen=True)
class Outcome:
    """What the agent is answered: the monitor's status and body for its report, or the relay's."""

    status: int
    body: dict
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Waiting:
    encoded: bytes
    attributed: bool
    future: asyncio.Future[Outcome]
    since: float


def unavailable(detail: str, retry_after_s: int = RETRY_AFTER_S) -> Outcome:
    """The relay is busy or stopping, the monitor behind it is up: 503 with Retry-After, which an
    agent takes as a monitor shedding load (it waits as told and sends its newest report)."""
    return Outcome(503, {"accepted": False, "detail": detail}, {"retry-after": str(retry_after_s)})


def monitor_down(detail: str) -> Outcome:
    """The monitor behind the relay did not take the reports: 502 without Retry-After, which an
    agent takes as the monitor down, so it keeps what changes meanwhile in its outage journal and
    delivers it when the monitor is back (agent/sender.py). A 503 with Retry-After would read as
    shedding, and an outage behind a relay would leave no trace in the jobs' history."""
    return Outcome(502, {"accepted": False, "detail": detail})


def batch_body(entries: list[tuple[bytes, bool]]) -> bytes:
    """The batch as JSON, made of the reports' own encodings (not decoded and encoded again)."""
    parts = [b'{"attributed":%s,"report":%s}' % (b"true" if attributed else b"false", encoded)
             for encoded, attributed in entries]
    return b'{"reports":[' + b",".join(parts) + b"]}"


class Forwarder:
    """Batches reports to ``owner`` (a monitor's base URL): one batch in flight at a time, so a slow
    monitor makes batches larger, not more numerous."""

    def __init__(self, owner: str, token: Callable[[], str | None], *, max_batch_bytes: int,
                 flush_s: float = FLUSH_S, max_waiting: int = MAX_WAITING, timeout_s: float = TIMEOUT_S,
                 verify: ssl.SSLContext | bool = True, client: httpx.AsyncClient | None = None,
                 on_batch: Callable[[float], None] = lambda seconds: None) -> None:
        self.owner, self.token, self.flush_s = owner.rstrip("/"), token, flush_s
        self.max_batch_bytes, self.max_waiting, self.timeout_s = max_batch_bytes, max_waiting, timeout_s
        # Reports by what became of them, for the relay's /metrics; on_batch(seconds) times each batch.
        # answered: by the monitor, each its own answer; monitor_refused_batch: the monitor refused the
        # whole batch (a wrong relay token, a size limit): fix the relay's settings.
        self.reports = {"answered": 0, "monitor_unreachable": 0, "monitor_refused_batch": 0, "shed": 0, "stale": 0}
        self.batches, self.on_batch = 0, on_batch
        self._client, self.verify = client, verify
        self._waiting: list[_Waiting] = []
        self._waiting_bytes = 0
        self._wake: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
        self._complained: str | None = None
        self._closed = False
        # When the batch now in flight was sent (loop time; None: none in flight), and how long the
        # last one took to be answered.
        self._in_flight_since: float | None = None
        self._last_batch_s = 0.0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def forward(self, encoded: bytes, attributed: bool) -> Outcome:
        """Send one checked report (``fastwire.decode_for_forwarding``) with the next batch; its answer."""
        if self._closed:
            return unavailable("relay stopping")
        loop = asyncio.get_running_loop()
        if len(self._waiting) >= self.max_waiting or \
                self._waiting_bytes + len(encoded) > MAX_WAITING_BATCHES * self.max_batch_bytes:
            self.reports["shed"] += 1
            return self._turned_away(loop.time())
        if self._sender is None or self._sender.done():
            self._wake = asyncio.Event()
            self._sender = loop.create_task(self._send_forever())
        future: asyncio.Future[Outcome] = loop.create_future()
        self._waiting.append(_Waiting(encoded, attributed, future, loop.time()))
        self._waiting_bytes += len(encoded)
        assert self._wake is not None
        self._wake.set()
        return await future

    async def close(self) -> None:
        """Stop sending: the batch in flight and every waiting report are answered 503."""
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        self._answer_all(self._waiting, unavailable("relay stopping"))
        self._waiting.clear()
        self._waiting_bytes = 0
        if self._client is not None:
            await self._client.aclose()

    @staticmethod
    def _answer_all(entries: list[_Waiting], outcome: Outcome) -> None:
        for waiting in entries:
            if not waiting.future.done():
                waiting.future.set_result(outcome)

    async def _send_forever(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                # The oldest report waits flush_s for company, unless a batch is full already.
                wait = self._waiting[0].since + self.flush_s - loop.time()
                if wait > 0 and len(self._waiting) < BATCH_REPORTS:
                    await asyncio.sleep(wait)
                batch = self._take_batch(loop.time())
                if not self._waiting:
                    self._wake.clear()
                if batch:
                    await self._send(batch)

    def _take_batch(self, now: float) -> list[_Waiting]:
        # Reports nobody waits for any more (their agents gave up and will send newer ones) go no further.
        stale = 0
        while stale < len(self._waiting) and now - self._waiting[stale].since > STALE_S:
            stale += 1
        if stale:
            gone, self._waiting = self._waiting[:stale], self._waiting[stale:]
            self._waiting_bytes -= sum(len(w.encoded) for w in gone)
            self.reports["stale"] += stale
            self._answer_all(gone, self._turned_away(now))
        size, count = 0, 0
        for waiting in self._waiting:
            if count and (count >= BATCH_REPORTS or size + len(waiting.encoded) > self.max_batch_bytes):
                break
            size += len(waiting.encoded)
            count += 1
        batch, self._waiting = self._waiting[:count], self._waiting[count:]
        self._waiting_bytes -= size
        return batch

    def _turned_away(self, now: float) -> Outcome:
        """The answer to a report the relay cannot send on. A monitor that has sat on a batch longer
        than an agent waits is as good as down (502: the agent keeps its outage journal); else the
        monitor is slow and the relay busy (503: the agent comes back later with its newest report)."""
        waited = now - self._in_flight_since if self._in_flight_since is not None else self._last_batch_s
        if waited > STALE_S:
            return monitor_down(f"relay: the monitor at {self.owner} sat on a batch for {waited:.1f}s")
        return unavailable("relay overloaded: the monitor is taking reports slower than they come")

    async def _send(self, batch: list[_Waiting]) -> None:
        loop = asyncio.get_running_loop()
        started = self._in_flight_since = loop.time()
        outcomes, how = [], "monitor_unreachable"
        try:
            outcomes, how = await self._post(
                batch_body([(waiting.encoded, waiting.attributed) for waiting in batch]), len(batch))
        except Exception as exc:  # a fault of the relay's own (a closed client, a bug): agents still get answers
            log.exception("sending a batch failed")
            outcomes, how = self._failed(len(batch), f"the relay could not send the batch ({type(exc).__name__})")
        finally:
            self._in_flight_since = None
            self._last_batch_s = loop.time() - started
            self.batches += 1
            self.on_batch(self._last_batch_s)
            self.reports[how] += len(batch)
            for waiting, outcome in zip(batch, outcomes):
                if not waiting.future.done():  # the agent's request may have gone (its timeout)
                    waiting.future.set_result(outcome)
            # Cancelled mid-post (close()): whatever got no answer gets the stopping one.
            self._answer_all(batch, unavailable("relay stopping"))

    @property
    def client(self) -> httpx.AsyncClient:
        """The one HTTP client to the monitor (its connection pool, its TLS context made once)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, verify=self.verify)
        return self._client

    async def _post(self, body: bytes, count: int) -> tuple[list[Outcome], str]:
        """Each report's outcome, and what became of the batch (a key of ``reports``)."""
        headers = {"content-type": "application/json"}
        token = self.token()
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            response = await self.client.post(self.owner + BATCH_PATH, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return self._failed(count, f"the monitor at {self.owner} is unreachable ({type(exc).__name__})")
        if response.status_code != 200:
            outcomes, how = self._failed(count, f"the monitor at {self.owner} answered the batch with HTTP "
                                                f"{response.status_code}: {response.text[:200]}")
            return outcomes, "monitor_refused_batch" if 400 <= response.status_code < 500 else how
        try:
            results = orjson.loads(response.content)["results"]
            outcomes = [Outcome(int(r["status"]), dict(r["body"]), dict(r.get("headers") or {})) for r in results]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            outcomes = []
        if len(outcomes) != count:
            return self._failed(count, f"the monitor at {self.owner} answered the batch with something else "
                                       "than one result per report")
        if self._complained is not None:
            log.warning("the monitor at %s takes batches again", self.owner)
            self._complained = None
        return outcomes, "answered"

    def _failed(self, count: int, why: str) -> tuple[list[Outcome], str]:
        if self._complained != why:  # once per distinct problem, not once a batch
            log.error("%s; agents are told to retry", why)
            self._complained = why
        return [monitor_down(f"relay: {why}")] * count, "monitor_unreachable"
