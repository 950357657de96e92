"""POST reports to the monitor from a background thread, always the newest one.

The sampling loop hands over each report and never waits on the network. When
the monitor is down (connection error, 5xx, a refused token) the sender backs off
exponentially (up to 4 s) and then sends whatever report is newest. Meanwhile every
report is offered to the outage journal (agent/outage_journal.py), which keeps the ones
where something changed; when the monitor answers again they are delivered first, oldest
first, marked ``replayed``, so what happened during the outage reaches the job's history
with its own times. A 4xx means the monitor rejects what we send: it is
logged once per distinct answer, and sending goes on. A 503 with ``Retry-After`` is a
monitor shedding load: the sender waits as told (not the growing backoff) and then sends
the newest report.

Once the monitor says it takes them (``"delta": true`` in its answer), reports carry only
what changed since the last one it took (agent/delta.py), after an outage too (on the last
report it kept, once the monitor took it): a monitor that restarted meanwhile asks for a full
report and says when, spreading the fleet's. A full report owed without a time said (an older
monitor; one that takes no kept reports) is held a random part of an interval first: every
agent of a fleet finds a restarted monitor within the same seconds.

With a token (hangwatch_common/token_file.py) every POST carries ``Authorization: Bearer <token>``. A 401
or 403 is the monitor refusing it: logged once per status until a report gets through again,
counted as failed and retried with the backoff (a token rotated in its file is picked up by
the next try). With a CA bundle (--ca-file) an https monitor's certificate is verified against
that bundle only.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hangwatch_common.http_client import httpx

from agent.delta import DeltaState
from agent.outage_journal import OutageJournal
from agent.shards import split

log = logging.getLogger(__name__)

REPORTS_PATH = "/api/v1/reports"
TIMEOUT_S = 2.0
# An evidence capture's part may be megabytes (a node of 8 ranks' native stacks and log tails).
UPLOAD_TIMEOUT_S = 60.0
BACKOFF_START_S = 0.5
# Capped low so the first report reaches a returning monitor within a few seconds; an attempt on a
# monitor that is down costs one refused (or timed-out) connection.
BACKOFF_MAX_S = 4.0
# The longest Retry-After honoured: a monitor asking for more is treated as down.
RETRY_AFTER_MAX_S = 30.0
REFUSED = (401, 403)
# Reports taken while one post is in flight, at most (a post lasts up to TIMEOUT_S, reports come
# every second or so): kept for the outage journal should that post fail.
OFFERED_KEPT = 8
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def reports_url(monitor: str) -> str:
    return monitor.rstrip("/") + REPORTS_PATH


def next_backoff(current: float) -> float:
    return min(BACKOFF_MAX_S, max(BACKOFF_START_S, current * 2))


def retry_delay(backoff: float, retry_after: float | None, rng: Callable[[], float] = random.random) -> float:
    """How long to wait before the next try, jittered: thousands of agents that lost one monitor at
    the same moment would otherwise retry in lockstep, and a restarted monitor would take them all in
    the same second. A failed try waits between half and all of its backoff; a shedding monitor's
    Retry-After is a floor (never sooner than asked), spread over up to half as much again."""
    if retry_after is not None:
        return retry_after * (1.0 + 0.5 * rng())
    return backoff * (0.5 + 0.5 * rng())


class Sender:
    """``token``: gives the current bearer token (TokenSource.current); ``verify``: httpx's
    (an SSLContext from tls_context, or True for its default bundle)."""

    def __init__(self, monitor: str, client: httpx.Client | None = None,
                 token: Callable[[], str] | None = None, verify: ssl.SSLContext | bool = True,
                 journal: OutageJournal | None = None, on_orders: Callable[[object, Any], None] | None = None):
        self.url = reports_url(monitor)
        self.base = monitor.rstrip("/")
        # Gets the signal orders of the monitor's answers (agent/signal_orders.py).
        self.on_orders = on_orders
        # What changed while the monitor could not be reached (agent/outage_journal.py).
        self.journal = journal if journal is not None else OutageJournal()
        self._down = len(self.journal) > 0  # a journal left from before a restart: deliver it first
        self._latest_at = 0.0
        self.client = client or httpx.Client(timeout=TIMEOUT_S, verify=verify)
        self.token = token
        parts = urlsplit(self.url)
        if token is not None and parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
            log.warning("sending the token to %s over plain http: anyone on the path can read it; use https", monitor)
        self._latest: dict | None = None
        # Reports offered since the one being sent was taken, while the monitor is not known to be
        # down: if that post fails, the outage began before them, and they are its first news.
        self._offered_since_taken: collections.deque[tuple[dict, float]] = collections.deque(maxlen=OFFERED_KEPT)
        self._cond = threading.Condition()
        self._stop = False
        self._logged_rejections: set[str] = set()
        self._down_logged = False
        self._refused_logged: int | None = None  # the status of the refusal last logged
        self.sent = 0
        self.failed = 0
        self.replayed = 0
        # Each body sent is numbered (monitor/ingest/report_order.py: a replayed body is refused).
        self._seq = 0
        # Set once the monitor refused a number as stale: this agent's reports are then a new run
        # that started at this time (the body's agent.started_at), numbered from 1 again.
        self._run_started_at: float | None = None
        self.runs_started = 0
        self.delta = DeltaState()
        # Seconds the monitor asked to wait (503 + Retry-After), for the sending thread.
        self.retry_after: float | None = None
        self._thread = threading.Thread(target=self._run, name="sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, report: dict) -> None:
        with self._cond:
            self._latest, self._latest_at = report, time.time()
            if self._down:
                self.journal.keep(report, self._latest_at)
            else:
                self._offered_since_taken.append((report, self._latest_at))
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
        response = self._send(self._numbered(dict(compact, sent_at=time.time())))
        if response is None:
            return False
        if response.status_code >= 400:
            return True  # refused as malformed (logged): retrying the same shape would not help
        answer = _json_or_none(response)
        self.delta.delivered(baseline, answer)
        self._note_up()
        if answer and answer.get("orders") and self.on_orders is not None:
            self.on_orders(answer["orders"], self)
        return True

    def _numbered(self, body: dict) -> dict:
        """``body`` with its number, in this agent's current run of reports."""
        self._seq += 1
        body["seq"] = self._seq
        if self._run_started_at is not None and isinstance(body.get("agent"), dict):
            body["agent"] = dict(body["agent"], started_at=self._run_started_at)
        return body

    def _start_new_run(self, response: httpx.Response) -> None:
        """The monitor took a number of this run as stale: a body was replayed (or forged) with this
        agent's run ahead of it. Waiting would not help (the monitor never goes back), so the
        reports start a new run, which the monitor takes as a restarted agent's."""
        previous = self._run_started_at
        self._run_started_at = max(time.time(), (previous or 0.0) + 0.001)
        self._seq = 0
        self.runs_started += 1
        self.delta.reset()  # the next report is full: the new run's first
        log.warning("monitor refused report as stale (%s): another sender used this node's numbers; "
                    "starting a new run of reports", response.text[:300])

    def upload(self, path: str, gzipped: bytes) -> str | None:
        """POST an evidence capture's part (agent/capture.py) to ``path`` on this monitor; None when
        taken, else why not. Off the sending thread: it must not delay the reports."""
        if not path.startswith("/api/v1/capture-uploads/"):
            return f"refused to upload to {path[:100]!r}: not a capture upload path"
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token()}"
        try:
            response = self.client.post(self.base + path, content=gzipped, headers=headers, timeout=UPLOAD_TIMEOUT_S)
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}"[:300]
        if response.status_code >= 300:
            return f"HTTP {response.status_code}: {response.text[:300]}"
        return None

    def deliver_journal(self) -> bool:
        """Send what the journal kept, oldest first; True once it is empty (False: the monitor is down)."""
        delivered = 0
        # The last kept report the monitor took, with its answer: its picture of this node from then on.
        taken: tuple[dict, dict] | None = None
        while True:
            with self._cond:  # the sampling thread adds to the journal while this sends
                kept = self.journal.oldest()
            if kept is None:
                break
            body = self._numbered(dict(kept.report, sent_at=kept.taken_at, replayed=True, delta=False))
            response = self._send(body)
            if response is None:
                return False
            answer = _json_or_none(response) or {}
            with self._cond:
                if response.status_code < 400 and not answer.get("replay"):
                    # A monitor that cannot place reports in the past would take them as news.
                    log.warning("monitor at %s does not take reports kept through an outage; %d dropped",
                                self.url, len(self.journal))
                    self.journal.clear()
                    taken, delivered = None, delivered + 1
                    break
                self.journal.delivered_oldest()
            taken = (kept.report, answer) if response.status_code < 400 else None
            self.replayed += 1
            delivered += 1
        if delivered:
            log.info("delivered %d reports kept through the outage (%d delivered since start)",
                     delivered, self.replayed)
        if taken is not None:
            # The monitor's picture of this node is now the last kept report: deltas go on from it. A
            # monitor that restarted meanwhile asks for a full report, and says when (its herd paced).
            self.delta.adopt(*taken)
        elif delivered:
            # The last one was refused, or the monitor takes no reports kept through an outage: the next
            # one is full, spread (the whole fleet is coming back to this monitor now).
            self.delta.reset(spread=True)
        return True

    def _send(self, body: dict) -> httpx.Response | None:
        """POST one body; the answer, or None when the monitor is down or refused the token."""
        self.retry_after = None
        headers = {"content-type": "application/json"}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token()}"
        try:
            response = self.client.post(self.url, content=json.dumps(body), headers=headers)
        except httpx.HTTPError as e:
            self._note_down(f"{type(e).__name__}: {e}{_tls_hint(e)}")
            return None
        if response.status_code in REFUSED:
            self._note_refused(response)
            return None
        if response.status_code >= 500:
            if response.status_code == 503:
                self.retry_after = _retry_after(response.headers.get("retry-after"))
            self._note_down(f"HTTP {response.status_code}")
            return None
        if response.status_code == 409:
            self._start_new_run(response)
            return response
        if response.status_code >= 400:
            key = f"{response.status_code} {response.text[:500]}"
            if key not in self._logged_rejections:
                self._logged_rejections.add(key)
                log.error("monitor rejected the report: %s", key)
        return response

    def _note_up(self) -> None:
        if self._down_logged:
            log.info("monitor reachable again at %s", self.url)
            self._down_logged = False
        if self._refused_logged is not None:
            log.info("monitor at %s takes the reports again", self.url)
            self._refused_logged = None
        self.sent += 1

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

    def _take_latest(self) -> tuple[dict, float]:
        """The newest report, to send now (with ``_cond`` held)."""
        assert self._latest is not None
        report, taken_at, self._latest = self._latest, self._latest_at, None
        self._offered_since_taken.clear()
        return report, taken_at

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                while self._latest is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                report, taken_at = self._take_latest()
            # Back from an outage: what was kept goes first, oldest first, then the newest report.
            delivered = not self._down or self.deliver_journal()
            if delivered and self._down:
                with self._cond:
                    if self._latest is not None:
                        # Taken while the journal was delivered (and delivered with it): the present
                        # is that one, not the older ``report``, which would show the monitor a step back.
                        report, taken_at = self._take_latest()
            spread = self.delta.take_spread_s() if delivered else 0.0
            if spread:
                with self._cond:
                    if self._cond.wait_for(lambda: self._stop, timeout=spread):
                        return
                    if self._latest is not None:  # taken while held: the newest goes
                        report, taken_at = self._take_latest()
            if delivered and self.post(report):
                with self._cond:
                    self._down = False
                    if len(self.journal):
                        # Kept while that last post was on its way: newer than what it carried, and the
                        # next report tells the monitor the same, live. Left here, they would be
                        # replayed at the next outage as if they had just happened.
                        self.journal.clear()
                backoff = 0.0
                continue
            shedding = self.retry_after is not None
            with self._cond:
                if not shedding and not self._down:
                    # The outage starts: from now on every report is offered to the journal.
                    self._down = True
                    self.journal.keep(report, taken_at)
                    # Taken while the failing post was in flight (up to its timeout against a monitor
                    # that hangs), when offer() kept nothing: the outage's too.
                    for offered, offered_at in self._offered_since_taken:
                        self.journal.keep(offered, offered_at)
                    self._offered_since_taken.clear()
                if self._latest is None:
                    self._latest, self._latest_at = report, taken_at  # nothing newer yet: retry this one
            # A shedding monitor says when to come back (it is up: nothing to keep); a failing one
            # gets the growing backoff.
            if not shedding:
                backoff = next_backoff(backoff)
            delay = retry_delay(backoff, self.retry_after if shedding else None)
            with self._cond:
                self._cond.wait_for(lambda: self._stop, timeout=delay)


def journal_path(directory: Path | None, monitor: str) -> Path | None:
    """The outage journal's file for one monitor in ``directory`` (None: kept in memory only)."""
    if directory is None:
        return None
    return directory / f"outage-{hashlib.sha256(monitor.encode()).hexdigest()[:16]}.jsonl"


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
                 verify: ssl.SSLContext | bool = True, journal_dir: Path | None = None,
                 on_orders: Callable[[object, Any], None] | None = None) -> None:
        self.monitors = list(monitors)
        self.senders = {m: Sender(m, token=token, verify=verify, journal=OutageJournal(journal_path(journal_dir, m)),
                                  on_orders=on_orders)
                        for m in self.monitors}

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
