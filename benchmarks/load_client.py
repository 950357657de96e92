"""The load side of the scale benchmark: simulated nodes posting to a real monitor over HTTP/1.1.

A minimal keep-alive HTTP client on asyncio streams, because the load generator shares the
machine with the monitor it measures: every CPU-microsecond it spends is one the monitor
does not get. Each node keeps its own connection (like one agent per node), sends one report
an interval (a second unless ``Behaviour.interval_s`` says otherwise) at its own phase, and, like
the agent, sends the newest report rather than catching up when a post ran long.

``Behaviour`` says how often the simulated agents report (``interval_s``: they say so in their
reports, as the agent does, and the monitor holds a node fresh for three of them), and how they
meet a monitor that restarts: whether they take the
monitor's pacing of full reports (``full_in_s``; off: as agents before it, the full report at the
next one), and whether they keep an outage journal as the agent does (agent/outage_journal.py:
the report at the outage's start and one every KEEP_EVERY_S, delivered replayed when the monitor
is back, the deltas going on from the last one, and retry a monitor that is down after the
agent's jittered backoff, agent/sender.py).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
import random
import time
from dataclasses import dataclass, field

import orjson

from simulated_nodes import SimulatedNode

from agent.delta import DeltaState
from agent.sender import next_backoff, retry_delay
from agent.shards import split

# The agent's own timeout (agent/sender.py): a slower answer is a failed post for it too.
POST_TIMEOUT_S = 2.0
# The agent's outage journal keeps a quiet node's report this often (agent/outage_journal.py).
KEEP_EVERY_S = 5.0


@dataclass(frozen=True)
class Behaviour:
    ignore_full_in: bool = False
    journal: bool = False
    interval_s: float = 1.0


@dataclass
class LoadStats:
    sent: int = 0
    accepted: int = 0
    shed: int = 0  # 503 answers
    failed: int = 0  # connection errors, timeouts, other statuses
    full_reports: int = 0
    replayed: int = 0  # kept reports delivered after an outage
    bytes_sent: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, of accepted posts in the window
    latency_at: list[float] = field(default_factory=list)  # when each of those was sent
    full_at: list[float] = field(default_factory=list)  # when each full report of the window was sent
    failed_at: list[float] = field(default_factory=list)  # when each failed post of the window was sent
    # Why posts of the window failed: "timeout", "connection", or "HTTP <status>".
    failed_why: dict[str, int] = field(default_factory=dict)

    def merge(self, other: LoadStats) -> None:
        for name in ("sent", "accepted", "shed", "failed", "full_reports", "replayed", "bytes_sent"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("latencies", "latency_at", "full_at", "failed_at"):
            getattr(self, name).extend(getattr(other, name))
        for why, count in other.failed_why.items():
            self.failed_why[why] = self.failed_why.get(why, 0) + count


class HttpConnection:
    """One keep-alive connection; reconnects after any error."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self._reader is not None and self._reader.at_eof():
            # Closed by the server while idle (uvicorn's keep-alive timeout, 5 s: every post of an agent
            # that reports less often): a fresh connection, as the agent's httpx pool opens one.
            self.close()
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self._writer.write(head.encode() + b"\r\n" + body)
        try:
            header = await self._reader.readuntil(b"\r\n\r\n")
            status = int(header.split(b" ", 2)[1])
            length = 0
            chunked = False
            for line in header.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                elif name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            payload = await self._read_chunked() if chunked else await self._reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        return status, payload

    async def _read_chunked(self) -> bytes:
        assert self._reader is not None
        parts = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def run_node(node: SimulatedNode, ports: list[int], protocol: str, start: float, window: tuple[float, float],
                   end: float, stats: LoadStats, behaviour: Behaviour = Behaviour()) -> None:
    """One node's agent: a report an interval, split by job owner when there are several monitors."""
    monitors = [f"http://127.0.0.1:{p}" for p in ports]
    conns = {m: HttpConnection("127.0.0.1", p) for m, p in zip(monitors, ports)}
    deltas = {m: DeltaState() for m in monitors}
    journals: dict[str, list[tuple[dict, float]]] = {m: [] for m in monitors}
    down = dict.fromkeys(monitors, False)
    backoff = 0.0
    interval = behaviour.interval_s
    slot = start + random.random() * interval
    while slot < end:
        await asyncio.sleep(max(0.0, slot - time.time()))
        now = time.time()
        report = node.report(now)
        # The agent's --interval, in its report (simulated_nodes says 1 s): the monitor's freshness window.
        report["agent"]["interval_s"] = interval
        parts = split(report, monitors)
        results = await asyncio.gather(*(send(conns[m], deltas[m], part, protocol, now, window, stats, behaviour,
                                              journals[m], down, m)
                                         for m, part in parts.items()))
        if behaviour.journal and any(down.values()):
            # Like the agent's sender: a monitor that is down is tried again after a jittered, growing backoff.
            backoff = next_backoff(backoff)
            slot = time.time() + retry_delay(backoff, None)
            continue
        backoff = 0.0
        # Like the agent: the next report is the newest one, at the next whole interval.
        late = time.time() + max(results) - slot
        slot += (int(late / interval) + 1) * interval if late > interval else interval
    for conn in conns.values():
        conn.close()


async def send(conn: HttpConnection, delta: DeltaState, full: dict, protocol: str, now: float,
               window: tuple[float, float], stats: LoadStats, behaviour: Behaviour,
               journal: list[tuple[dict, float]], down: dict[str, bool], monitor: str) -> float:
    """Like the agent's sender: what was kept through an outage first (with ``behaviour.journal``),
    then the report; return the seconds the monitor asked to wait (503 Retry-After)."""
    if down[monitor] and journal:
        for kept, taken_at in list(journal):
            status, answer = await _post(conn, orjson.dumps(dict(kept, sent_at=taken_at, replayed=True, delta=False)))
            if status != 202:
                return 0.0  # still down: the live report waits too, as the agent's does
            journal.pop(0)
            stats.replayed += 1
            if not journal and protocol == "delta":
                delta.adopt(kept, orjson.loads(answer))
    waited = await post(conn, delta, full, protocol, now, window, stats, behaviour)
    if waited is None:
        if behaviour.journal and (not journal or now - journal[-1][1] >= KEEP_EVERY_S):
            journal.append((full, now))
        down[monitor] = True
        return 0.0
    down[monitor] = False
    return waited


async def _post(conn: HttpConnection, body: bytes) -> tuple[int | None, bytes]:
    """The answer's status and body; no status and why not (``timeout``, ``connection``) when none came."""
    try:
        return await asyncio.wait_for(conn.request("POST", "/api/v1/reports", body), POST_TIMEOUT_S)
    except asyncio.TimeoutError:
        conn.close()
        return None, b"timeout"
    except (OSError, asyncio.IncompleteReadError, ValueError):
        conn.close()
        return None, b"connection"


async def post(conn: HttpConnection, delta: DeltaState, full: dict, protocol: str, now: float,
               window: tuple[float, float], stats: LoadStats, behaviour: Behaviour = Behaviour()) -> float | None:
    """Post one report; return the seconds the monitor asked to wait (503 Retry-After), None when it is
    down (no answer, or a status that is not its own refusal)."""
    body_dict, baseline = delta.compact(full) if protocol == "delta" else (full, None)
    # orjson: the stdlib's encoder was ~40% of the generator's CPU per report (it shares a core).
    body = orjson.dumps(body_dict)
    in_window = window[0] <= now < window[1]
    if in_window:
        stats.sent += 1
        stats.bytes_sent += len(body)
        if not body_dict.get("delta"):
            stats.full_reports += 1
            stats.full_at.append(now)
    status, answer = await _post(conn, body)
    if status is None:
        if in_window:
            stats.failed += 1
            stats.failed_at.append(now)
            why = answer.decode()
            stats.failed_why[why] = stats.failed_why.get(why, 0) + 1
        return None
    took = time.time() - now
    if status == 202:
        if baseline is not None:
            said = orjson.loads(answer)
            if behaviour.ignore_full_in:
                said.pop("full_in_s", None)  # as agents before the pacing: the full report next time
            delta.delivered(baseline, said)
        if in_window:
            stats.accepted += 1
            stats.latencies.append(took)
            stats.latency_at.append(now)
        return 0.0
    if in_window:
        stats.shed += status == 503
        stats.failed += status != 503
        if status != 503:
            stats.failed_why[f"HTTP {status}"] = stats.failed_why.get(f"HTTP {status}", 0) + 1
    if status == 503:
        return 2.0  # the monitor's default Retry-After
    return None if status >= 500 else 0.0  # a relay whose monitor is down answers 502


def run_shard(nodes: list[SimulatedNode], ports: list[int] | Callable[[SimulatedNode], list[int]], protocol: str,
              start: float, window: tuple[float, float], end: float, behaviour: Behaviour = Behaviour()) -> LoadStats:
    """Run these nodes until ``end`` (wall clock) in one event loop; the stats of the measured window.

    ``ports``: the monitors every node posts to (sharded by job), or a node's own (its relay).
    """
    stats = LoadStats()
    # The simulated agents' baselines are ~1 M long-lived objects at 10,000 ranks: CPython's
    # collections rescanned them and took most of the generator's CPU (a report cost ~1.5 ms, not
    # ~0.3), which capped what one core offers. They form no cycles worth collecting in a run (the
    # shard is a process of its own).
    gc.disable()

    async def main() -> None:
        await asyncio.gather(*(run_node(n, ports(n) if callable(ports) else ports, protocol, start, window, end, stats,
                                        behaviour)
                               for n in nodes))

    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    return stats
