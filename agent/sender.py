"""POST reports to the monitor from a background thread, always the newest one.

The sampling loop hands over each report and never waits on the network. When
the monitor is down (connection error, 5xx) the sender backs off exponentially
(up to 30 s) and then sends whatever report is newest: stale reports are
replaced, never queued. A 4xx means the monitor rejects what we send: it is
logged once per distinct answer, and sending goes on. A 503 with ``Retry-After`` is a
monitor shedding load: the sender waits as told (not the growing backoff) and then sends
the newest report.

Once the monitor says it takes them (``"delta": true`` in its answer), reports carry only
what changed since the last one it took (agent/delta.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx

from agent.delta import DeltaState
from agent.shards import split

log = logging.getLogger(__name__)

REPORTS_PATH = "/api/v1/reports"
TIMEOUT_S = 2.0
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# The longest Retry-After honoured: a monitor asking for more is treated as down.
RETRY_AFTER_MAX_S = 30.0


def reports_url(monitor: str) -> str:
    return monitor.rstrip("/") + REPORTS_PATH


def next_backoff(current: float) -> float:
    return min(BACKOFF_MAX_S, max(BACKOFF_START_S, current * 2))


class Sender:
    def __init__(self, monitor: str, client: httpx.Client | None = None):
        self.url = reports_url(monitor)
        self.client = client or httpx.Client(timeout=TIMEOUT_S)
        self._latest: dict | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._logged_rejections: set[str] = set()
        self._down_logged = False
        self.sent = 0
        self.failed = 0
        self.delta = DeltaState()
        # Seconds the monitor asked to wait (503 + Retry-After), for the sending thread.
        self.retry_after: float | None = None
        self._thread = threading.Thread(target=self._run, name="sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, report: dict) -> None:
        with self._cond:
            self._latest = report
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=TIMEOUT_S + 1)
        self.client.close()

    def post(self, report: dict) -> bool:
        """Send one report now; True when the monitor took it. Sets sent_at at sending time."""
        compact, baseline = self.delta.compact(report)
        body = dict(compact, sent_at=time.time())
        self.retry_after = None
        try:
            response = self.client.post(
                self.url, content=json.dumps(body), headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as e:
            self._note_down(f"{type(e).__name__}: {e}")
            return False
        if response.status_code >= 500:
            if response.status_code == 503:
                self.retry_after = _retry_after(response.headers.get("retry-after"))
            self._note_down(f"HTTP {response.status_code}")
            return False
        if response.status_code >= 400:
            key = f"{response.status_code} {response.text[:500]}"
            if key not in self._logged_rejections:
                self._logged_rejections.add(key)
                log.error("monitor rejected the report: %s", key)
            return True  # retrying the same shape would not help
        self.delta.delivered(baseline, _json_or_none(response))
        if self._down_logged:
            log.info("monitor reachable again at %s", self.url)
            self._down_logged = False
        self.sent += 1
        return True

    def _note_down(self, why: str) -> None:
        self.failed += 1
        if not self._down_logged:
            log.warning("monitor unreachable at %s (%s); retrying with backoff", self.url, why)
            self._down_logged = True

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                while self._latest is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                report, self._latest = self._latest, None
            if self.post(report):
                backoff = 0.0
                continue
            # A shedding monitor says when to come back; a failing one gets the growing backoff.
            backoff = self.retry_after if self.retry_after is not None else next_backoff(backoff)
            with self._cond:
                if self._latest is None:
                    self._latest = report  # nothing newer yet: retry this one
                self._cond.wait_for(lambda: self._stop, timeout=backoff)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (the delay form; a date is not worth parsing here)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    if seconds is None or not 0 <= seconds <= RETRY_AFTER_MAX_S:
        return None
    return seconds


def _json_or_none(response: httpx.Response) -> dict | None:
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class ShardedSender:
    """One ``Sender`` per monitor; each report is split by job owner (agent/shards.py)."""

    def __init__(self, monitors: list[str] | tuple[str, ...]) -> None:
        self.monitors = list(monitors)
        self.senders = {m: Sender(m) for m in self.monitors}

    def start(self) -> None:
        for sender in self.senders.values():
            sender.start()

    def offer(self, report: dict) -> None:
        for monitor, part in split(report, self.monitors).items():
            self.senders[monitor].offer(part)

    def post(self, report: dict) -> bool:
        results = [self.senders[m].post(part) for m, part in split(report, self.monitors).items()]
        return all(results)

    def stop(self) -> None:
        for sender in self.senders.values():
            sender.stop()

    def close(self) -> None:
        for sender in self.senders.values():
            sender.client.close()

    @property
    def sent(self) -> int:
        return sum(s.sent for s in self.senders.values())

    @property
    def failed(self) -> int:
        return sum(s.failed for s in self.senders.values())
