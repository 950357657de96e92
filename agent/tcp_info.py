"""How well the link carries each established TCP connection: the kernel's ``struct tcp_info``, read
through netlink sock_diag as ``ss -ti`` reads it (psutil and /proc/net/tcp do not have it).

sock_diag answers for the network namespace of the netlink socket asking, so a rank in another
namespace (a container, a simulated node) is asked through a socket made inside its namespace: a
short-lived thread enters it (setns acts on the calling thread only), makes the socket, and ends; the
socket stays bound to that namespace for good. One socket per namespace, kept while it is used (it
holds the namespace alive, so an idle one is closed), and each namespace dumped once per sweep.

Where the kernel refuses (no CAP_SYS_ADMIN to enter a namespace, no sock_diag or tcp_diag, a filter
on netlink), the sockets go without these details: logged once, retried now and then, never an error
of the tick.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1
CLONE_NEWNET = 0x40000000

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, idiag_ext, pad, states, then a zeroed inet_diag_sockid (48 bytes).
INET_DIAG_REQ_V2 = struct.Struct("=BBBBI48x")
# inet_diag_msg: family, state, timer, retrans, the sockid, expires, rqueue, wqueue, uid, inode.
INET_DIAG_MSG = struct.Struct("=BBBB48xIIIII")
RTATTR = struct.Struct("=HH")

DUMP_TIMEOUT_S = 1.0
RECV_BYTES = 65536
IDLE_CLOSE_S = 60.0  # longer than the sockets collector's SOCKETS_EVERY_S: a used namespace stays open
RETRY_REFUSED_S = 300.0
NO_MIN_RTT = 0xFFFFFFFF  # tcp_min_rtt() before the first sample (minmax reset to ~0U)

# Offsets in struct tcp_info (include/uapi/linux/tcp.h); older kernels send a shorter struct.
U32_FIELDS = {"unacked": 24, "lost": 32, "rtt_us": 68, "total_retrans": 100, "notsent_bytes": 144,
              "min_rtt_us": 148}
U64_FIELDS = {"bytes_acked": 120, "delivery_rate": 160}


def parse_tcp_info(raw: bytes) -> dict[str, int | None]:
    """The fields the agent reports, by name; a field past the end of an older kernel's struct is None."""
    out: dict[str, int | None] = {}
    for name, offset in U32_FIELDS.items():
        out[name] = struct.unpack_from("=I", raw, offset)[0] if len(raw) >= offset + 4 else None
    for name, offset in U64_FIELDS.items():
        out[name] = struct.unpack_from("=Q", raw, offset)[0] if len(raw) >= offset + 8 else None
    if out["min_rtt_us"] == NO_MIN_RTT:
        out["min_rtt_us"] = None
    return out


def dump_request(family: int, seq: int) -> bytes:
    """A sock_diag dump request for the family's established TCP sockets, with their tcp_info."""
    body = INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, 1 << TCP_ESTABLISHED)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse_dump(data: bytes, seq: int, into: dict[int, bytes]) -> bool:
    """Adds the socket inode -> raw tcp_info pairs of one netlink read to ``into``; True at the dump's end.
    Raises OSError for the kernel's refusal. Messages of another sequence (a dump given up earlier) are skipped."""
    at = 0
    while at + NLMSGHDR.size <= len(data):
        length, kind, _flags, msg_seq, _pid = NLMSGHDR.unpack_from(data, at)
        if length < NLMSGHDR.size or at + length > len(data):
            raise ValueError(f"truncated netlink message ({length} bytes at {at})")
        body = at + NLMSGHDR.size
        if msg_seq == seq:
            if kind == NLMSG_DONE:
                return True
            if kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", data, body)[0]
                if code:
                    raise OSError(code, f"sock_diag: {os.strerror(code)}")
            elif kind == SOCK_DIAG_BY_FAMILY and length >= NLMSGHDR.size + INET_DIAG_MSG.size:
                inode = INET_DIAG_MSG.unpack_from(data, body)[8]
                info = _attribute(data, body + INET_DIAG_MSG.size, at + length, INET_DIAG_INFO)
                if inode and info is not None:
                    into[inode] = info
        at += (length + 3) & ~3
    return False


def _attribute(data: bytes, at: int, end: int, wanted: int) -> bytes | None:
    while at + RTATTR.size <= end:
        length, kind = RTATTR.unpack_from(data, at)
        if length < RTATTR.size:
            return None
        if kind == wanted:
            return data[at + RTATTR.size : at + length]
        at += (length + 3) & ~3
    return None


@dataclass(frozen=True)
class Reading:
    bytes_acked: int | None
    total_retrans: int | None
    at: float


def _rate(now: int | None, before: int | None, seconds: float) -> float | None:
    if now is None or before is None or now < before or seconds <= 0:
        return None  # no earlier reading, or a counter that went back (an inode reused)
    return round((now - before) / seconds, 1)


def tcp_report(info: dict[str, int | None], before: Reading | None, now: float) -> dict:
    """The TcpInfoReport dict: the kernel's figures, and the rates since ``before`` (None on a first reading)."""
    seconds = now - before.at if before else 0.0

    def ms(us: int | None) -> float | None:
        return round(us / 1000, 3) if us is not None else None

    return {
        "rtt_ms": ms(info["rtt_us"]),
        "min_rtt_ms": ms(info["min_rtt_us"]),
        "total_retrans": info["total_retrans"],
        "retrans_per_s": _rate(info["total_retrans"], before.total_retrans, seconds) if before else None,
        "lost": info["lost"],
        "unacked": info["unacked"],
        "notsent_bytes": info["notsent_bytes"],
        "delivery_rate_bps": min(info["delivery_rate"], 10**15) if info["delivery_rate"] is not None else None,
        "bytes_acked_per_s": _rate(info["bytes_acked"], before.bytes_acked, seconds) if before else None,
    }


# --- netlink, in the rank's namespace -----------------------------------------------------------

def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python >= 3.12
        os.setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def diag_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    sock.settimeout(DUMP_TIMEOUT_S)  # never hang a tick on the kernel
    return sock


def diag_socket_in(ns_path: str) -> socket.socket:
    """A sock_diag socket bound to the network namespace at ``ns_path`` (/proc/PID/ns/net). Made in a
    thread of its own: setns moves only that thread, which goes back and ends, the agent's others untouched."""
    made: dict = {}

    def enter() -> None:
        try:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            try:
                target = os.open(ns_path, os.O_RDONLY)
                try:
                    _setns(target)
                finally:
                    os.close(target)
                made["socket"] = diag_socket()
                try:
                    _setns(home)
                except OSError:
                    pass  # the thread ends now: nothing else runs in the namespace it is left in
            finally:
                os.close(home)
        except OSError as e:
            made["error"] = e

    worker = threading.Thread(target=enter, name="hangwatch-netns", daemon=True)
    worker.start()
    worker.join()
    if "error" in made:
        raise made["error"]
    return made["socket"]


def same_namespace(ns_path: str) -> bool:
    """Whether ``ns_path`` names the namespace this thread is in (no setns needed, nor privilege)."""
    mine, theirs = os.stat("/proc/thread-self/ns/net"), os.stat(ns_path)
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def dump(sock: socket.socket, seq: int) -> dict[int, bytes]:
    """Socket inode -> raw tcp_info of every established TCP socket (IPv4 and IPv6) the socket's namespace has."""
    out: dict[int, bytes] = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        sock.sendto(dump_request(family, seq + family), (0, 0))
        try:
            while not parse_dump(sock.recv(RECV_BYTES), seq + family, out):
                pass
        except OSError as e:
            if family == socket.AF_INET6 and e.errno in (errno.ENOENT, errno.EAFNOSUPPORT, errno.EINVAL):
                continue  # a kernel without IPv6: its IPv4 answer stands
            raise
    return out


@dataclass
class _Namespace:
    sock: socket.socket
    used_at: float
    seq: int = 0
    readings: dict[int, Reading] = field(default_factory=dict)


@dataclass
class TcpInfoReader:
    """tcp_info of established connections per network namespace: each namespace dumped once per sweep."""

    clock: Callable[[], float] = time.monotonic
    open_socket: Callable[[str], socket.socket] | None = None  # tests: a refusing or fake opener
    _namespaces: dict[str, _Namespace] = field(default_factory=dict)
    _refused: dict[str, float] = field(default_factory=dict)  # namespace -> when it refused
    _sweep: dict[str, dict[int, dict] | None] = field(default_factory=dict)
    _warned: bool = False

    def new_sweep(self) -> None:
        self._sweep.clear()
        now = self.clock()
        for key, ns in list(self._namespaces.items()):
            if now - ns.used_at > IDLE_CLOSE_S:  # its ranks are gone: let the kernel free the namespace
                ns.sock.close()
                del self._namespaces[key]
        for key, at in list(self._refused.items()):
            if now - at > RETRY_REFUSED_S:
                del self._refused[key]

    def reports(self, netns: str, ns_path: str) -> dict[int, dict] | None:
        """Socket inode -> TcpInfoReport dict for the namespace ``netns`` (the readlink of ``ns_path``);
        None where the kernel refuses."""
        if netns not in self._sweep:
            self._sweep[netns] = self._read(netns, ns_path)
        return self._sweep[netns]

    def _read(self, netns: str, ns_path: str) -> dict[int, dict] | None:
        if netns in self._refused:
            return None
        now = self.clock()
        ns = self._namespaces.get(netns)
        try:
            if ns is None:
                ns = self._namespaces[netns] = _Namespace(self._open(ns_path), now)
            ns.seq += 16  # past both families' sequence numbers of the last dump
            raw = dump(ns.sock, ns.seq)
        except (OSError, ValueError, struct.error) as e:
            self._refuse(netns, e)
            return None
        ns.used_at = now
        out, readings = {}, {}
        for inode, blob in raw.items():
            info = parse_tcp_info(blob)
            out[inode] = tcp_report(info, ns.readings.get(inode), now)
            readings[inode] = Reading(info["bytes_acked"], info["total_retrans"], now)
        ns.readings = readings  # connections that went away are dropped
        return out

    def _open(self, ns_path: str) -> socket.socket:
        if self.open_socket is not None:
            return self.open_socket(ns_path)
        return diag_socket() if same_namespace(ns_path) else diag_socket_in(ns_path)

    def _refuse(self, netns: str, e: Exception) -> None:
        ns = self._namespaces.pop(netns, None)
        if ns is not None:
            ns.sock.close()
        self._refused[netns] = self.clock()
        level = logging.DEBUG if self._warned else logging.WARNING
        log.log(level, "no TCP details (sock_diag) for network namespace %s: %s; sockets go without them", netns, e)
        self._warned = True

    def close(self) -> None:
        for ns in self._namespaces.values():
            ns.sock.close()
        self._namespaces.clear()
