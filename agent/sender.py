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

With a token (agent/token_file.py) every POST carries ``Authorization: Bearer <token>``. A 401
or 403 is the monitor refusing it: logged once per status until a report gets through again,
counted as failed and retried with the backoff (a token rotated in its file is picked up by
the next try). With a CA bundle (--ca-file) an https monitor's certificate is verified against
that bundle only.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

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
REFUSED = (401, 403)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def tls_context(ca_file: str) -> ssl.SSLContext:
    """Verification against this CA bundle alone (a private CA), not the system's.
    Raises OSError or ssl.SSLError for a missing or certificate-less file."""
    return ssl.create_default_context(cafile=ca_file)


def reports_url(monitor: str) -> str:
    return monitor.rstrip("/") + REPORTS_PATH


def next_backoff(current: float) -> float:
    return min(BACKOFF_MAX_S, max(BACKOFF_START_S, current * 2))


class Sender:
    """``token``: gives the current bearer token (TokenSource.current); ``verify``: httpx's
    (an SSLContext from tls_context, or True for its default bundle)."""

    def __init__(self, monitor: str, client: httpx.Client | None = None,
                 token: Callable[[], str] | None = None, verify: ssl.SSLContext | bool = True):
        self.url = reports_url(monitor)
        self.client = client or httpx.Client(timeout=TIMEOUT_S, verify=verify)
        self.token = token
        parts = urlsplit(self.url)
        if token is not None and parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
            log.warning("sending the token to %s over plain http: anyone on the path can read it; use https", monitor)
        self._latest: dict | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._logged_rejections: set[str] = set()
        self._down_logged = False
        self._refused_logged: int | None = None  # the status of the refusal last logged
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
        headers = {"content-type": "application/json"}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token()}"
        try:
            response = self.client.post(self.url, content=json.dumps(body), headers=headers)
        except httpx.HTTPError as e:
            self._note_down(f"{type(e).__name__}: {e}{_tls_hint(e)}")
            return False
        if response.status_code in REFUSED:
            self._note_refused(response)
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
        if self._refused_logged is not None:
            log.info("monitor at %s takes the reports again", self.url)
            self._refused_logged = None
        self.sent += 1
        return True

    def _note_refused(self, response: httpx.Response) -> None:
        self.failed += 1
        if self._refused_logged == response.status_code:
            return
        self._refused_logged = response.status_code
        # The answer's text, never the request's headers: the token stays out of the log.
        answer = f"HTTP {response.status_code} {response.text[:300]}".strip()
        if self.token is None:
            log.error("monitor at %s wants a token (%s): give the agent --token-file", self.url, answer)
        else:
            log.error("monitor refused the token: %s (from %s); retrying with backoff", answer, self.url)

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


def _tls_hint(error: httpx.HTTPError) -> str:
    if "CERTIFICATE_VERIFY_FAILED" in str(error):
        return " -- the monitor's certificate is not trusted: --ca-file names the CA bundle that signed it"
    return ""


def _json_or_none(response: httpx.Response) -> dict | None:
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class ShardedSender:
    """One ``Sender`` per monitor; each report is split by job owner (agent/shards.py)."""

    def __init__(self, monitors: list[str] | tuple[str, ...], token: Callable[[], str] | None = None,
                 verify: ssl.SSLContext | bool = True) -> None:
        self.monitors = list(monitors)
        self.senders = {m: Sender(m, token=token, verify=verify) for m in self.monitors}

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
