"""A process's TCP sockets, from /proc/PID/fd and /proc/PID/net/tcp{,6}.

psutil's net_connections() reads the caller's network namespace only; a rank in
another namespace (a container, a simulated node) shows its own through
/proc/PID/net/. Its sockets are the entries whose inode one of its fds names
(``socket:[INODE]``). A namespace's tables are read once per sweep, however
many ranks share it. Established connections carry the kernel's tcp_info
(agent/tcp_info.py) where the reader is given one.

Addresses: IPv4 as "a.b.c.d:port", IPv6 as "[addr]:port"; v4-mapped IPv6
(``::ffff:127.0.0.1``, what a dual-stack listener's peers look like) as plain
IPv4, so they compare equal to MASTER_ADDR and to the peer's own view.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace

from agent.tcp_info import TcpInfoReader

MAX_SOCKETS = 256

# include/net/tcp_states.h
TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
    "0C": "NEW_SYN_RECV",
}
# Most telling first when the list must be cut: a connection that never completes
# is the evidence of a firewall; listeners show who serves the rendezvous.
STATE_ORDER = {"SYN_SENT": 0, "SYN_RECV": 1, "LISTEN": 2, "ESTABLISHED": 3, "CLOSE_WAIT": 4}


def parse_hex_ip(text: str) -> str:
    """The kernel prints addresses as native-endian 32-bit words (little-endian on x86/arm)."""
    raw = bytes.fromhex(text)
    if len(raw) not in (4, 16):
        raise ValueError(f"not an IPv4/IPv6 address: {text!r}")
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(swapped))
    addr = ipaddress.IPv6Address(swapped)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)


def parse_hex_endpoint(text: str) -> tuple[str, int]:
    ip_hex, _, port_hex = text.partition(":")
    return parse_hex_ip(ip_hex), int(port_hex, 16)


def format_endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass(frozen=True)
class TcpEntry:
    inode: int
    local: str
    remote: str
    state: str
    local_port: int
    tx_queue: int
    rx_queue: int
    # The TcpInfoReport dict, established connections only (agent/tcp_info.py); None: not read.
    tcp: dict | None = field(default=None, compare=False)

    def report(self) -> dict:
        return {
            "local": self.local,
            "remote": self.remote,
            "state": self.state,
            "tx_queue": self.tx_queue,
            "rx_queue": self.rx_queue,
            "tcp": self.tcp,
        }


def parse_net_tcp(text: str) -> dict[int, TcpEntry]:
    """inode -> entry, from the text of /proc/PID/net/tcp or tcp6 (header line skipped).

    Entries with inode 0 (TIME_WAIT, orphaned sockets) belong to no fd and are left out.
    """
    out = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10:
            continue
        try:
            inode = int(parts[9])
            if not inode:
                continue
            lip, lport = parse_hex_endpoint(parts[1])
            rip, rport = parse_hex_endpoint(parts[2])
            tx, _, rx = parts[4].partition(":")
            state = TCP_STATES.get(parts[3].upper(), parts[3])
            out[inode] = TcpEntry(
                inode, format_endpoint(lip, lport), format_endpoint(rip, rport), state, lport,
                int(tx, 16), int(rx, 16),
            )
        except ValueError:
            continue
    return out


def socket_inode(link: str) -> int | None:
    """The inode of an fd's link target "socket:[12345]", else None."""
    if link.startswith("socket:[") and link.endswith("]"):
        try:
            return int(link[8:-1])
        except ValueError:
            return None
    return None


def socket_inodes(proc_root: str, pid: int) -> list[int]:
    """Socket inodes among the process's open fds, in fd order."""
    base = f"{proc_root}/{pid}/fd"
    out = []
    for fd in os.listdir(base):
        try:
            inode = socket_inode(os.readlink(f"{base}/{fd}"))
        except OSError:
            continue  # closed meanwhile
        if inode is not None:
            out.append(inode)
    return out


def select_sockets(entries: list[TcpEntry], cap: int = MAX_SOCKETS) -> list[TcpEntry]:
    ranked = sorted(entries, key=lambda e: (STATE_ORDER.get(e.state, 9), e.local_port))
    return ranked[:cap]


@dataclass
class SocketReader:
    """Reads sockets of many processes; each network namespace's tables once per sweep."""

    proc_root: str = "/proc"
    # Established connections' tcp_info (sock_diag); None: sockets without it (the discovery's own reader).
    tcp_info: TcpInfoReader | None = None
    _tables: dict[str, dict[int, TcpEntry]] = field(default_factory=dict)

    def new_sweep(self) -> None:
        self._tables.clear()
        if self.tcp_info is not None:
            self.tcp_info.new_sweep()

    def close(self) -> None:
        if self.tcp_info is not None:
            self.tcp_info.close()

    def table_of(self, pid: int) -> dict[int, TcpEntry]:
        """inode -> entry for the network namespace of ``pid`` (read once per sweep)."""
        return self._table(pid)

    def _netns(self, pid: int) -> str | None:
        try:
            return os.readlink(f"{self.proc_root}/{pid}/ns/net")
        except OSError:
            return None

    def _table(self, pid: int) -> dict[int, TcpEntry]:
        netns = self._netns(pid) or f"pid:{pid}"  # no ns link (old kernel, other proc root): read per process
        table = self._tables.get(netns)
        if table is None:
            table = {}
            for name in ("tcp", "tcp6"):
                try:
                    with open(f"{self.proc_root}/{pid}/net/{name}") as f:
                        table.update(parse_net_tcp(f.read()))
                except FileNotFoundError:
                    continue  # no IPv6 in that namespace; a vanished pid fails on fd below
            self._tables[netns] = table
        return table

    def sockets_of(self, pid: int, cap: int = MAX_SOCKETS) -> list[TcpEntry]:
        inodes = socket_inodes(self.proc_root, pid)  # raises for a vanished process
        if not inodes:
            return []
        table = self._table(pid)
        chosen = select_sockets([table[i] for i in inodes if i in table], cap)
        return self._with_tcp_info(pid, chosen)

    def _with_tcp_info(self, pid: int, entries: list[TcpEntry]) -> list[TcpEntry]:
        """Only where an established connection is there to describe: a listener's namespace is not dumped."""
        netns = self._netns(pid)
        if self.tcp_info is None or netns is None or not any(e.state == "ESTABLISHED" for e in entries):
            return entries
        infos = self.tcp_info.reports(netns, f"{self.proc_root}/{pid}/ns/net")
        if not infos:
            return entries
        return [replace(e, tcp=infos.get(e.inode)) if e.state == "ESTABLISHED" else e for e in entries]


def listening_ports(entries: list[TcpEntry]) -> list[int]:
    return sorted({e.local_port for e in entries if e.state == "LISTEN"})
