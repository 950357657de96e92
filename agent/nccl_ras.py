"""NCCL's own account of a job, read live from its RAS service.

When one rank issues an extra collective, every rank of an NCCL job spins in
cudaStreamSynchronize at the same Python line: the stacks cannot tell who diverged. NCCL can.
Since NCCL 2.24 every NCCL process runs a RAS thread and one of them per node listens for
clients (``localhost:28028``, or ``NCCL_RAS_ADDR``); asked ``VERBOSE STATUS`` it gathers from
every process of the job each communicator's ranks with their per-type collective counts,
asynchronous errors, and the ranks it got no answer from.

- ``fetch_status`` speaks the line protocol (short timeouts, a bounded answer);
- agent/nccl_ras_answer.py reads the answer (pure) and keeps this node's ranks;
- ``NcclRasPoller`` runs one fetch at a time on a thread of its own, so a slow or hung
  service never holds up the sampling loop.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from agent.nccl_ras_answer import local_view, parse_status

DEFAULT_ADDRESS = "localhost:28028"  # NCCL's own default; "localhost" tries 127.0.0.1 and ::1
RAS_PORT = 28028
CONNECT_TIMEOUT_S = 0.5
# The handshake lines come from the service's own thread at once.
REPLY_TIMEOUT_S = 1.0
# The status itself is a collective over the job's RAS network, and NCCL waits up to 5 s per
# leg for a peer that does not answer: exactly the missing-rank case worth reading. The poll
# runs on its own thread, so this wait costs the sampling loop nothing.
ANSWER_TIMEOUT_S = 12.0
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_LINE_BYTES = 4096


class RasError(Exception):
    """The service could not be read (timeout, garbage, closed early): the text says why."""


class NoListener(RasError):
    """Nothing listens at the address: the normal case for jobs without NCCL."""


# --- the protocol -------------------------------------------------------------------------


def parse_address(text: str | None) -> tuple[str, int] | None:
    """(host, port) from NCCL_RAS_ADDR's "host:port" ("[::1]:28028", "node7:28028", "10.0.0.1");
    a wildcard address means this node. None when unreadable."""
    text = (text or "").strip()
    if not text:
        return None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""  # a bare name, or a bare IPv6 address
    if not host or (port_text and not port_text.isdigit()):
        return None
    port = int(port_text) if port_text else RAS_PORT
    if not 0 < port < 65536:
        return None
    if host in ("0.0.0.0", "::", "*"):
        host = "localhost"
    return host, port


def format_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Reader:
    """Lines, then the rest to EOF, from a socket, each read bounded by a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def line(self, deadline: float) -> str:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE_BYTES:
                raise RasError("not a RAS service (no line break in its answer)")
            chunk = self._recv(deadline)
            if not chunk:
                raise RasError("the service closed the connection without answering")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", "replace").strip()

    def rest(self, deadline: float, limit: int) -> bytes:
        parts, size = [self.buffer], len(self.buffer)
        while chunk := self._recv(deadline):
            size += len(chunk)
            if size > limit:
                raise RasError(f"answer larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def send(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(_left(deadline))
        self.sock.sendall(data)

    def _recv(self, deadline: float) -> bytes:
        self.sock.settimeout(_left(deadline))
        return self.sock.recv(65536)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def fetch_status(
    address: tuple[str, int],
    *,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    reply_timeout: float = REPLY_TIMEOUT_S,
    answer_timeout: float = ANSWER_TIMEOUT_S,
    max_bytes: int = MAX_ANSWER_BYTES,
) -> str:
    """The service's answer to ``VERBOSE STATUS`` in JSON, as text.

    Raises ``NoListener`` when nothing listens, ``RasError`` for anything else that goes wrong.
    """
    where = format_address(address)
    try:
        sock = socket.create_connection(address, timeout=connect_timeout)
    except ConnectionRefusedError:
        raise NoListener(f"nothing listens at {where}") from None
    except TimeoutError:
        raise RasError(f"connecting to {where} timed out") from None
    except OSError as e:
        raise RasError(f"cannot connect to {where}: {e.strerror or e}") from None
    step = "the handshake"
    try:
        with sock:
            reader = _Reader(sock)
            deadline = time.monotonic() + reply_timeout
            reader.send(b"CLIENT PROTOCOL 2\n", deadline)
            hello = reader.line(deadline)
            if not hello.upper().startswith("SERVER PROTOCOL"):
                raise RasError(f"not a RAS service at {where}: {hello[:80]!r}")
            reader.send(b"SET FORMAT json\n", deadline)
            answer = reader.line(deadline)
            if answer.upper() != "OK":
                raise RasError(f"the service at {where} has no JSON output ({hello}): {answer[:80]!r}")
            step = "the status"
            deadline = time.monotonic() + answer_timeout
            reader.send(b"VERBOSE STATUS\n", deadline)
            body = reader.rest(deadline, max_bytes)
    except TimeoutError:
        raise RasError(f"{step} from {where} timed out") from None
    except RasError:
        raise
    except (BrokenPipeError, ConnectionResetError):
        # Whether the close shows as EOF, a reset or a broken pipe depends on when our next send
        # lands: one cause, one message.
        raise RasError(f"the service at {where} closed the connection without answering ({step})") from None
    except OSError as e:
        raise RasError(f"reading {where}: {e.strerror or e}") from None
    return body.decode("utf-8", "replace")


def namespace_pid(proc_root: str, pid: int) -> int | None:
    """The pid the process sees for itself (its innermost PID namespace), from NSpid."""
    try:
        with open(f"{proc_root}/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[-1]) if fields else None
    except (OSError, ValueError):
        return None
    return None


def choose_address(configured: str | None, envs: Iterable[Mapping[str, str]]) -> tuple[str, int] | None:
    """The listener to ask: the agent's option, else the ranks' NCCL_RAS_ADDR, else NCCL's default."""
    if configured:
        return parse_address(configured)
    given = [e["NCCL_RAS_ADDR"] for e in envs if e.get("NCCL_RAS_ADDR")]
    # Every rank of a node should agree; if not, the most common setting wins.
    text = max(sorted(set(given)), key=given.count) if given else DEFAULT_ADDRESS
    return parse_address(text)


def read_ras(
    address: tuple[str, int],
    pids: Mapping[int, int],
    local_hosts: Collection[str],
    fetch: Callable[[tuple[str, int]], str] = fetch_status,
) -> tuple[str, str, list[dict]]:
    """(status, NCCL version, this node's communicators). Status "ok" when NCCL answered."""
    try:
        text = fetch(address)
    except NoListener:
        return "no listener", "", []
    except RasError as e:
        return str(e)[:256], "", []
    try:
        parsed = parse_status(text)
    except ValueError as e:
        return f"bad answer: {e}"[:256], "", []
    return "ok", parsed["nccl_version"], local_view(parsed, pids, local_hosts)


# --- off the sampling loop ----------------------------------------------------------------


class NcclRasPoller:
    """One poll at a time on a short-lived thread; the loop reads the latest result.

    The result is the report's ``nccl_ras`` (monitor/ingest/wire.py ``NcclRasReport``): when it was
    read, since when NCCL's answer has stayed the same (a hang freezes the counts), the
    status, and this node's communicators.
    """

    def __init__(self, clock: Callable[[], float] = time.time, fetch: Callable[[tuple[str, int]], str] = fetch_status):
        self._clock = clock
        self._fetch = fetch
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._result: dict | None = None
        # A poll that raised (a bug, not NCCL's answer): for the collector's health entry.
        self.failure: str | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, address: tuple[str, int], pids: Mapping[int, int], local_hosts: Collection[str]) -> bool:
        """Start a poll unless one is under way; True when started."""
        if self.busy:
            return False
        self._thread = threading.Thread(
            target=self._poll, args=(address, dict(pids), frozenset(local_hosts)), name="nccl-ras", daemon=True
        )
        self._thread.start()
        return True

    def note(self, status: str, address: str = "") -> None:
        """A result without a poll (no ranks left, RAS turned off in the ranks' environment)."""
        with self._lock:
            if self._result is None or self._result["status"] != status:
                self._publish(status, address, "", [])

    def result(self) -> dict | None:
        with self._lock:
            return self._result

    def wait(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _poll(self, address: tuple[str, int], pids: dict[int, int], local_hosts: frozenset[str]) -> None:
        try:
            status, version, comms = read_ras(address, pids, local_hosts, self._fetch)
            self.failure = None
        except Exception as e:  # noqa: BLE001 -- a bug here must not kill the thread silently
            status, version, comms = "failed", "", []
            self.failure = f"{type(e).__name__}: {e}"[:2048]
        with self._lock:
            self._publish(status, format_address(address), version, comms)

    def _publish(self, status: str, address: str, version: str, comms: list[dict]) -> None:
        now, status = self._clock(), status[:256]
        previous = self._result
        same = previous is not None and (previous["status"], previous["communicators"]) == (status, comms)
        self._result = {
            "polled_at": now,
            "unchanged_since": previous["unchanged_since"] if same else now,
            "status": status,
            "address": address[:256],
            "nccl_version": version,
            "communicators": comms,
        }
