"""POST reports to the monitor from a background thread, always the newest one.

The sampling loop hands over each report and never waits on the network. When
the monitor is down (connection error, 5xx) the sender backs off exponentially
(up to 30 s) and then sends whatever report is newest: stale reports are
replaced, never queued. A 4xx means the monitor rejects what we send: it is
logged once per distinct answer, and sending goes on.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx

log = logging.getLogger(__name__)

REPORTS_PATH = "/api/v1/reports"
TIMEOUT_S = 2.0
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


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
        body = dict(report, sent_at=time.time())
        try:
            response = self.client.post(
                self.url, content=json.dumps(body), headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as e:
            self._note_down(f"{type(e).__name__}: {e}")
            return False
        if response.status_code >= 500:
            self._note_down(f"HTTP {response.status_code}")
            return False
        if response.status_code >= 400:
            key = f"{response.status_code} {response.text[:500]}"
            if key not in self._logged_rejections:
                self._logged_rejections.add(key)
                log.error("monitor rejected the report: %s", key)
            return True  # retrying the same shape would not help
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
            backoff = next_backoff(backoff)
            with self._cond:
                if self._latest is None:
                    self._latest = report  # nothing newer yet: retry this one
                self._cond.wait_for(lambda: self._stop, timeout=backoff)
