"""Who may talk to the monitor: bearer tokens read from files, checked before anything else runs.

Four kinds of request, each with its own optional token file:

- ``ingest`` (``POST /api/v1/reports``): agents. A line of the file is either a token any node
  may use, or ``NODE TOKEN``: a token bound to that node, so a node can only report for itself
  (the ingest layer compares the report's ``node`` with the binding and answers 403).
- ``read`` (the page, ``/diagnose``, ``/api/...``): people and their tools. A browser cannot add
  a bearer header to a page load, so ``Basic`` credentials whose password is the token are taken
  too; a 401 on a read offers ``Basic`` and the browser asks for it.
- ``metrics`` (``/metrics``): Prometheus, with its ``authorization`` (bearer) setting.
- ``relay`` (``POST /api/v1/report-batches``): relays (monitor/relay/) forwarding many nodes'
  reports. A relay checks each report against the agents' node-bound tokens itself; the monitor
  believes those checks (opt-in actions need them) only from a token of the relay file. Without
  a relay file, batches take an ingest token that is bound to no node, and vouch for nothing.

A kind whose file is not configured is open. ``/healthz`` and ``/readyz`` are always open: liveness
and readiness probes carry no secrets. So is the runbook (``/runbook`` and its stylesheet): the
alerts link there, and the person paged may hold no read token. Files are re-read when they change
(rotation without a restart); a file that turns unreadable or empty keeps the last good tokens and
is logged, so a botched edit cannot lock every agent out. Tokens are looked up by their SHA-256
digest (no timing says how close a guess was) and never logged.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from hangwatch_common.watched_file import SecretFileError, Signature, WatchedFile, read_private
from monitor.storage.capture_store import CAPTURE_UPLOAD_PREFIX
from monitor.web.runbook import RUNBOOK_PATH, STYLE_PATH

log = logging.getLogger("hangwatch.monitor.auth")

INGEST, READ, METRICS, RELAY, OPEN = "ingest", "read", "metrics", "relay", "open"
KINDS = (INGEST, READ, METRICS, RELAY)
INGEST_PATH = "/api/v1/reports"
BATCH_PATH = "/api/v1/report-batches"
# A summarising relay's summary of its nodes' giant jobs (monitor/ingest/summary_wire.py).
SUMMARY_PATH = "/api/v1/summaries"
# Where the ingest layer finds the node an accepted token is bound to (None: any node).
BOUND_NODE_KEY = "hangwatch.bound_node"
# Set when a batch came with a token of the relay file: its node checks are believed.
RELAY_KEY = "hangwatch.relay"
# Probes of liveness and readiness (monitor/web/routes/health.py): orchestrators' probes carry no secrets.
# And the runbook page (monitor/web/runbook.py): every alert links to it, and whoever is paged may have
# no read token; a password prompt is the wrong answer mid-incident. It says nothing of this monitor's
# jobs, nodes or settings: it is the project's published docs/runbook.md, the same for every monitor.
OPEN_PATHS = frozenset({"/healthz", "/readyz", RUNBOOK_PATH, STYLE_PATH})
# A file of many per-node tokens: 10,000 nodes at ~80 bytes a line.
MAX_TOKEN_FILE_BYTES = 4 << 20

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


TokenFileError = SecretFileError


@dataclass(frozen=True)
class Tokens:
    """The tokens of one file: each maps to the node it is bound to, or None (any node)."""

    bound_to: dict[str, str | None] = field(default_factory=dict)
    # SHA-256 of each token -> its binding: one lookup however many nodes have tokens (10,000
    # per-node tokens compared one by one cost milliseconds per report). The lookup's timing
    # can only tell about digests, which say nothing about the tokens.
    _by_digest: dict[bytes, str | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_digest.update((_digest(token), bound) for token, bound in self.bound_to.items())

    def match(self, presented: str) -> tuple[bool, str | None]:
        """(accepted, bound node)."""
        digest = _digest(presented)
        if digest not in self._by_digest:
            return False, None
        return True, self._by_digest[digest]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def parse_tokens(text: str, *, allow_nodes: bool, source: str) -> Tokens:
    """The tokens in a file's text: ``TOKEN`` or (where allowed) ``NODE TOKEN`` per line; # comments."""
    bound_to: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) == 1:
            bound_to[parts[0]] = None
        elif len(parts) == 2 and allow_nodes:
            node, token = parts
            bound_to[token] = node
        else:
            form = "TOKEN or NODE TOKEN" if allow_nodes else "TOKEN"
            raise TokenFileError(f"{source} line {number}: expected {form}")
    for token in bound_to:
        if len(token) < 16:
            raise TokenFileError(f"{source}: a token is shorter than 16 characters; use a random one")
    if not bound_to:
        raise TokenFileError(f"{source} holds no token")
    return Tokens(bound_to)


def read_token_file(path: str, *, allow_nodes: bool) -> tuple[Tokens, Signature]:
    """The file's tokens and its signature; refuses a file that others can read."""
    data, signature = read_private(path, MAX_TOKEN_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenFileError(f"token file {path} is not UTF-8 text") from None
    return parse_tokens(text, allow_nodes=allow_nodes, source=f"token file {path}"), signature


class TokenFile(WatchedFile[Tokens]):
    """One token file, re-read when it changes (looked at most once a second)."""

    def __init__(self, path: Path, *, allow_nodes: bool, clock: Callable[[], float] = time.monotonic) -> None:
        # Raises TokenFileError at start-up: a monitor must not come up open by mistake.
        super().__init__(str(path), functools.partial(read_token_file, allow_nodes=allow_nodes), logger=log,
                         keeping="keeping the tokens read before", clock=clock)

    @property
    def tokens(self) -> Tokens:
        return self.current()


def request_kind(path: str) -> str:
    if path in OPEN_PATHS:
        return OPEN
    if path == INGEST_PATH or path.startswith(CAPTURE_UPLOAD_PREFIX):
        return INGEST  # an agent's report, or its part of an evidence capture
    if path in (BATCH_PATH, SUMMARY_PATH):
        return RELAY
    if path == "/metrics":
        return METRICS
    return READ


def presented_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token in ``Authorization``: ``Bearer TOKEN``, or ``Basic`` with the token as password."""
    for name, value in headers:
        if name != b"authorization":
            continue
        scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
        scheme, credentials = scheme.lower(), credentials.strip()
        if scheme == "bearer":
            return credentials
        if scheme == "basic":
            try:
                decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return decoded.partition(":")[2]
        return None
    return None


class AuthLayer:
    """ASGI layer in front of everything: 401 unless the request's kind is open or its token matches."""

    def __init__(self, app: ASGIApp, files: dict[str, TokenFile], on_refused: Callable[[str], None]) -> None:
        self.app, self.files, self.on_refused = app, files, on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = request_kind(scope["path"])
        token_file = self.files.get(kind)
        if kind == RELAY and token_file is None:
            kind, token_file = INGEST, self.files.get(INGEST)
        if token_file is None:
            await self.app(scope, receive, send)
            return
        presented = presented_token(scope["headers"])
        accepted, node = token_file.current().match(presented) if presented else (False, None)
        if not accepted:
            self.on_refused(kind)
            await _unauthorized(send, kind, presented is not None)
            return
        if kind == INGEST:
            scope[BOUND_NODE_KEY] = node
        elif kind == RELAY:
            scope[RELAY_KEY] = True
        await self.app(scope, receive, send)


async def _unauthorized(send: Send, kind: str, had_token: bool) -> None:
    detail = "the token is not accepted" if had_token else "authentication required: send Authorization: Bearer TOKEN"
    body = orjson.dumps({"accepted": False, "detail": detail} if kind in (INGEST, RELAY) else {"detail": detail})
    # A browser shows its password prompt for Basic: the page's reader types the read token there.
    challenge = b'Basic realm="hangwatch", charset="UTF-8"' if kind == READ else b'Bearer realm="hangwatch"'
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", challenge)]})
    await send({"type": "http.response.body", "body": body})
