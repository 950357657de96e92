"""tcp_info through sock_diag (agent/tcp_info.py): real loopback connections, in this namespace and in a
fresh one, a short struct from an older kernel, and a kernel (or a user) that refuses."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from agent.sockets import SocketReader
from agent.tcp_info import U32_FIELDS, TcpInfoReader, parse_tcp_info
from monitor.ingest.wire import SocketReport

ME = os.getpid()
MY_NS = f"/proc/{ME}/ns/net"


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return listener, client, server


def _inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino  # a socket fd's inode is the one sock_diag names


@pytest.fixture
def tcp_reader():
    reader = TcpInfoReader()
    try:
        yield reader
    finally:
        reader.close()  # its netlink socket


def _reports(reader: TcpInfoReader) -> dict[int, dict]:
    reader.new_sweep()
    found = reader.reports(os.readlink(MY_NS), MY_NS)
    assert found is not None
    return found


def test_a_loopback_connection_with_data_in_flight_is_found_by_inode_with_rates(tcp_reader):
    listener, client, server = _pair()
    client.setblocking(False)
    reader = tcp_reader
    try:
        first = _reports(reader)[_inode(client)]
        assert first["rtt_ms"] > 0 and 0 < first["min_rtt_ms"] <= first["rtt_ms"] + 1
        assert first["bytes_acked_per_s"] is None and first["retrans_per_s"] is None  # no earlier reading
        assert _inode(server) in _reports(reader)
        sent = 0
        try:  # fill the peer's receive buffer and our send buffer: data queued, not yet sent
            while sent < 64 << 20:
                sent += client.send(b"x" * 65536)
        except BlockingIOError:
            pass
        time.sleep(0.05)
        later = _reports(reader)[_inode(client)]
        assert later["notsent_bytes"] > 0 or later["unacked"] > 0, later
        assert later["bytes_acked_per_s"] > 0 and later["retrans_per_s"] is not None
        SocketReport.model_validate({"local": "a", "remote": "b", "state": "ESTABLISHED", "tcp": later})
    finally:
        for s in (client, server, listener):
            s.close()


def test_the_offsets_agree_with_the_kernels_own_struct(tcp_reader):
    """getsockopt(TCP_INFO) hands back the same struct: parsed the same way, a quiet connection's
    counters match what sock_diag said of it."""
    listener, client, server = _pair()
    try:
        client.sendall(b"y" * 10_000)
        server.recv(20_000)

        def own_info() -> dict:
            return parse_tcp_info(client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 512))

        deadline = time.monotonic() + 5
        while own_info()["unacked"] and time.monotonic() < deadline:  # the peer's ACK may be delayed
            time.sleep(0.01)
        via_diag, own = _reports(tcp_reader)[_inode(client)], own_info()
        assert own["bytes_acked"] >= 10_000
        assert (own["total_retrans"], own["lost"], own["unacked"]) == (
            via_diag["total_retrans"], via_diag["lost"], via_diag["unacked"])
        assert own["min_rtt_us"] / 1000 == via_diag["min_rtt_ms"]
    finally:
        for s in (client, server, listener):
            s.close()


def test_the_sockets_reader_attaches_tcp_to_established_only_and_drops_closed_ones():
    listener, client, server = _pair()
    reader = SocketReader(tcp_info=TcpInfoReader())
    try:
        reader.new_sweep()
        by_state = {}
        for e in reader.sockets_of(ME):
            if e.inode in (_inode(listener), _inode(client), _inode(server)):
                by_state.setdefault(e.state, []).append(e.report())
        assert [r["tcp"] for r in by_state["LISTEN"]] == [None]
        assert len(by_state["ESTABLISHED"]) == 2 and all(r["tcp"]["rtt_ms"] is not None
                                                         for r in by_state["ESTABLISHED"])
        gone = _inode(client)
        client.close()
        server.close()
        assert gone not in _reports(reader.tcp_info)
    finally:
        for s in (client, server, listener):
            s.close()
        reader.close()


# A connection on loopback inside the namespace the child was started in; its ports on stdout.
NETNS_CHILD = textwrap.dedent(
    """
    import socket, time
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen()
    c = socket.create_connection(ls.getsockname()); a, _ = ls.accept()
    c.sendall(b"x" * 5000)
    print(ls.getsockname()[1], c.getsockname()[1], flush=True)
    time.sleep(60)
    """
)

needs_unshare = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
                                   reason="needs root, unshare and ip")


def _child_in_new_netns(tmp_path) -> subprocess.Popen:
    script = tmp_path / "netns_child.py"
    script.write_text(NETNS_CHILD)
    return subprocess.Popen(
        ["unshare", "--net", "sh", "-c", f'ip link set lo up && exec "{sys.executable}" "{script}"'],
        stdout=subprocess.PIPE, text=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


@pytest.mark.live
@needs_unshare
def test_a_connection_in_another_network_namespace_is_read_through_its_pid(tmp_path, tcp_reader):
    proc = _child_in_new_netns(tmp_path)
    reader = SocketReader(tcp_info=TcpInfoReader())
    home = os.readlink("/proc/thread-self/ns/net")
    try:
        listen_port, client_port = map(int, proc.stdout.readline().split())
        assert os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink(MY_NS)
        reader.new_sweep()
        established = {e.local: e for e in reader.sockets_of(proc.pid) if e.state == "ESTABLISHED"}
        client = established[f"127.0.0.1:{client_port}"]
        assert client.tcp is not None and client.tcp["rtt_ms"] > 0, client
        assert established[f"127.0.0.1:{listen_port}"].tcp is not None
        # Only the helper thread entered the namespace: this one is where it was, and its own
        # namespace has no such connection.
        assert os.readlink("/proc/thread-self/ns/net") == home
        assert client.inode not in _reports(tcp_reader)
        reader.new_sweep()  # the cached socket answers the next sweep, with rates now
        again = {e.local: e for e in reader.sockets_of(proc.pid) if e.state == "ESTABLISHED"}
        assert again[f"127.0.0.1:{client_port}"].tcp["bytes_acked_per_s"] is not None
    finally:
        reader.close()
        _stop(proc)


def test_an_older_kernels_shorter_struct_leaves_the_later_fields_none():
    listener, client, server = _pair()
    try:
        full = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 512)
    finally:
        for s in (client, server, listener):
            s.close()
    # 104 bytes: Linux 3.x's struct ended after tcpi_total_retrans.
    old = parse_tcp_info(full[:104])
    new = parse_tcp_info(full)
    assert {k: old[k] for k in U32_FIELDS if U32_FIELDS[k] < 104} == {k: new[k] for k in U32_FIELDS if U32_FIELDS[k] < 104}
    assert old["bytes_acked"] is old["notsent_bytes"] is old["min_rtt_us"] is old["delivery_rate"] is None
    assert parse_tcp_info(b"") == dict.fromkeys(new)


def test_a_refused_namespace_goes_without_tcp_is_logged_once_and_retried_later(caplog):
    now = [1000.0]
    opened = []

    def refuse(path: str) -> socket.socket:
        opened.append(path)
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    reader = SocketReader(tcp_info=TcpInfoReader(clock=lambda: now[0], open_socket=refuse))
    listener, client, server = _pair()
    try:
        with caplog.at_level(logging.DEBUG, logger="agent.tcp_info"):
            for _ in range(3):
                reader.new_sweep()
                mine = [e for e in reader.sockets_of(ME) if e.inode == _inode(client)]
                assert mine[0].state == "ESTABLISHED" and mine[0].report()["tcp"] is None
        assert len(opened) == 1  # not asked again every sweep
        assert [r.levelname for r in caplog.records] == ["WARNING"]
        now[0] += 301
        reader.new_sweep()
        reader.sockets_of(ME)
        assert len(opened) == 2
    finally:
        for s in (client, server, listener):
            s.close()


@pytest.mark.live
@needs_unshare
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv")
def test_an_unprivileged_agent_reads_its_own_namespace_and_is_refused_another(tmp_path):
    """As nobody: another user's namespace cannot be entered (the real refusal), its own still answers."""
    proc = _child_in_new_netns(tmp_path)
    try:
        proc.stdout.readline()
        probe = (
            "from agent.tcp_info import TcpInfoReader; r = TcpInfoReader(); "
            f"print(r.reports('theirs', '/proc/{proc.pid}/ns/net') is None, "
            "r.reports('mine', '/proc/self/ns/net') is not None)"
        )
        done = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-c", probe],
            capture_output=True, text=True, timeout=30, cwd=os.getcwd(),
            env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["True", "True"]
        assert "no TCP details" in done.stderr  # logged, nothing raised
    finally:
        _stop(proc)
