"""Simulated nodes on one machine: network namespaces, a bridge, one process table per node.

Layout of one :class:`Fabric` (``uid`` = a short random id; everything is created by the
fabric and removed by ``close()``, also when a test fails, and by :func:`sweep_stale` for
fabrics whose creating process died without cleaning up)::

    namespace hw-<pidns>_<pid>-<uid>-sw  ("switch" + monitor host; <pidns>_<pid>: the creator)
        br0  10.231.0.254/24     the bridge; the monitor listens here
        pa, pb, ...              bridge ports, veth peers of the nodes' eth0
    namespace hw-<pidns>_<pid>-<uid>-a   node-a
        lo, eth0 10.231.0.1/24
    namespace hw-<pidns>_<pid>-<uid>-b   node-b
        lo, eth0 10.231.0.2/24

The root namespace's network is never touched: no interface, address, route or firewall
rule is added there. The veth pairs are created directly inside the switch namespace with
their peer in the node namespace.

**Process tables.** Each node has an init process started with
``ip netns exec NS unshare --pid --fork --mount-proc --kill-child python -m tests.netns init``:
pid 1 of the node's own PID namespace (it reaps orphans, as a real init does) with its own
``/proc``. Everything else on the node (agent, torchrun, helpers) enters that namespace
with ``nsenter --target <init> --net --pid --mount``, so the node's agent sees only that
node's processes, with node-local pids. Killing the init (SIGKILL) kills every process of the
node at once (the kernel ends a PID namespace with its init); the ``unshare`` parent kills
its child if it dies itself (``--kill-child``).

**Reaching the monitor.** The monitor runs in the switch namespace on
``10.231.0.254:<port>``, reachable from every node over the bridge. The test process
(in the root namespace) reaches it through a Unix socket: a small forwarder in the switch
namespace (``python -m tests.netns proxy``) accepts on ``<workdir>/monitor.sock`` and
connects to the monitor's TCP address. Unix sockets live in the file system, not in a
network namespace, so no address has to be added to the root namespace.
:class:`hangwatch.demo.harness.MonitorClient` takes ``uds=`` for this.

Firewall and slow links are applied inside a node namespace (``iptables`` / ``tc`` run with
``ip netns exec``); they disappear with the namespace.

Test machinery, not shipped: the e2e tests (tests/e2e/test_multinode.py) and the multi-node
benchmark cases (benchmarks/detection_time.py) use it; the helpers it starts run as
``python -m tests.netns`` from the checkout's root.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from hangwatch.demo.harness import TRAIN_SCRIPT, Job, Reaper, Service, _workload_env, tool
from tests.node_worker import INSIDE as NODE_NAMESPACE_MARK

SUBNET = "10.231.0"
PREFIX = 24
SWITCH_ADDR = f"{SUBNET}.254"
NS_PREFIX = "hw-"
NETNS_ETC = Path("/etc/netns")  # per-namespace /etc files that `ip netns exec` mounts
# The node init and the forwarder run this module (``python -m tests.netns``) from the checkout's root.
ROOT = Path(__file__).resolve().parent.parent
SELF = (sys.executable, "-m", "tests.netns")
# hw-<pid namespace>_<pid>-<uid>-<role>: the creator's pid is only meaningful in its own PID
# namespace (test workers run each in one of their own, tests/node_worker.py).
_NS_NAME = re.compile(rf"^{NS_PREFIX}(?P<pidns>\d+)_(?P<pid>\d+)-[0-9a-f]+-\w+$")


class NetnsUnavailable(RuntimeError):
    """This machine cannot create network namespaces (not root, no ``ip``/``unshare``/``nsenter``)."""


def _run(*cmd: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def missing_tools(*extra: str) -> list[str]:
    return [t for t in ("ip", "unshare", "nsenter", *extra) if shutil.which(t) is None]


def check_available(*extra: str) -> None:
    """Raise NetnsUnavailable unless namespaces (and the ``extra`` tools) can be used here."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    missing = missing_tools(*extra)
    if missing:
        raise NetnsUnavailable(f"missing tools: {', '.join(missing)} (apt-get install -y iproute2 util-linux"
                               f"{' iptables' if 'iptables' in missing else ''})")


def list_namespaces() -> list[str]:
    p = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _kill_ns_processes(ns: str) -> None:
    p = _run("ip", "netns", "pids", ns, check=False)
    for pid in (int(x) for x in p.stdout.split() if x.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def delete_namespace(ns: str) -> None:
    _kill_ns_processes(ns)
    _run("ip", "netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def write_hosts(ns: str, names: dict[str, str]) -> None:
    """/etc/hosts as programs in ``ns`` see it: this machine's, plus ``name -> address`` lines.
    ``ip netns exec`` bind-mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts``, and the node's
    processes inherit that mount."""
    folder = NETNS_ETC / ns
    folder.mkdir(parents=True, exist_ok=True)
    base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "127.0.0.1 localhost\n"
    lines = [f"{addr} {name}" for name, addr in sorted(names.items())]
    (folder / "hosts").write_text(base.rstrip("\n") + "\n# hangwatch simulated nodes\n" + "\n".join(lines) + "\n")


def _pid_namespace(pid: int | str = "self") -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def owner_tag() -> str:
    """``<pid namespace>_<pid>`` of this process: the start of the names of the namespaces it makes."""
    return f"{_pid_namespace()}_{os.getpid()}"


def _is_stale(name: str) -> bool:
    """Made by a process that is gone. A name from another PID namespace is judged only from outside
    every worker's namespace, where every process is visible: gone when no process is left in that
    namespace. A worker never judges another worker's fabrics."""
    m = _NS_NAME.match(name)
    if not m:
        return False
    pidns, pid = int(m.group("pidns")), int(m.group("pid"))
    if pidns == _pid_namespace():
        return not psutil.pid_exists(pid)
    if os.environ.get(NODE_NAMESPACE_MARK):
        return False
    return not any(_pid_namespace(p) == pidns for p in psutil.pids())


def sweep_stale() -> list[str]:
    """Delete namespaces left by fabrics whose creating process is gone (and their processes)."""
    gone = []
    for ns in list_namespaces():
        if _is_stale(ns):
            delete_namespace(ns)
            gone.append(ns)
    for folder in NETNS_ETC.glob(f"{NS_PREFIX}*") if NETNS_ETC.is_dir() else ():
        if _is_stale(folder.name):
            shutil.rmtree(folder, ignore_errors=True)
    return gone


# ---------------------------------------------------------------- node init and the forwarder


def _init_main() -> int:
    """pid 1 of a node: reap every child (orphans included) until killed."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


def _proxy_main(uds: str, host: str, port: int) -> int:
    """Forward connections on a Unix socket to host:port (run inside the switch namespace)."""

    async def handle(r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        try:
            r2, w2 = await asyncio.open_connection(host, port)
        except OSError:
            w1.close()
            return
        await asyncio.gather(_pipe(r1, w2), _pipe(r2, w1))

    async def serve() -> None:
        server = await asyncio.start_unix_server(handle, path=uds)
        async with server:
            await server.serve_forever()

    try:
        os.unlink(uds)
    except FileNotFoundError:
        pass
    asyncio.run(serve())
    return 0


# ---------------------------------------------------------------- nodes


@dataclass
class Node:
    name: str  # "node-a"
    ns: str
    addr: str
    fabric: Fabric
    ifname: str = "eth0"
    veth_switch_side: str = ""
    init: subprocess.Popen | None = None
    init_pid: int = 0  # global pid of the node's pid 1
    agent: Service | None = None

    # -- running things on the node

    def enter(self) -> list[str]:
        """Command prefix that runs a program on this node (its network, pids and /proc)."""
        return ["nsenter", f"--target={self.init_pid}", "--net", "--pid", "--mount", "--"]

    def popen(self, cmd: Sequence[str], *, log: Path | None = None, env: dict[str, str] | None = None,
              launcher: bool = False) -> subprocess.Popen:
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            return self.fabric.reaper.popen([*self.enter(), *cmd], launcher=launcher, stdout=out,
                                            stderr=subprocess.STDOUT, env=env)
        finally:
            if log:
                out.close()

    def sh(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """A short command in the node's network namespace (``ip``, ``iptables``, ``tc``, ``ss``)."""
        return _run("ip", "netns", "exec", self.ns, *cmd, check=check)

    def start_agent(self, monitor_url: str, *, interval: float = 1.0, extra: Sequence[str] = ()) -> Service:
        log = self.fabric.workdir / f"agent-{self.name}.log"
        proc = self.popen([tool("hangwatch-agent"), "--monitor", monitor_url, "--interval", str(interval),
                           "--node", self.name, *extra], log=log)
        time.sleep(0.3)
        if proc.poll() is not None:
            raise RuntimeError(f"agent on {self.name} exited with {proc.returncode}:\n"
                               f"{Service(proc, log).log_tail()}")
        self.agent = Service(proc, log)
        return self.agent

    def torchrun(self, train_args: Sequence[str], *, nnodes: int, node_rank: int, master_addr: str,
                 master_port: int, nproc: int = 1, env: dict[str, str] | None = None,
                 name: str = "job") -> Job:
        """``torchrun --nnodes=N --node-rank=K --master-addr=A --master-port=P train.py ...`` on this node.

        Static rendezvous (no ``--rdzv-*``): TORCHELASTIC_RUN_ID is ``none`` and the job id every
        agent reports is ``A:P``. ``env`` is added to the workload's environment (e.g.
        ``GLOO_SOCKET_IFNAME``).
        """
        log = self.fabric.workdir / f"{name}-{self.name}-torchrun.log"
        cmd = [tool("torchrun"), f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--node-rank={node_rank}",
               f"--master-addr={master_addr}", f"--master-port={master_port}", str(TRAIN_SCRIPT), *train_args]
        p = self.popen(cmd, log=log, env=_workload_env(env), launcher=True)
        job = Job(job_id=f"{master_addr}:{master_port}", kind="torchrun", logs=[log], launcher=p,
                  reaper=self.fabric.reaper)
        job.nproc = nproc
        return job

    # -- network trouble

    def iptables(self, *rule: str) -> None:
        self.sh("iptables", *rule)

    def tc(self, *args: str) -> None:
        self.sh("tc", *args)

    def tcp_sockets(self) -> str:
        """``ss -tanp`` inside the node (for failure messages and observations)."""
        return self.sh("ss", "-tanp", check=False).stdout


@dataclass
class Fabric:
    """A switch namespace with a bridge, and nodes on it. Use as a context manager."""

    workdir: Path
    reaper: Reaper = field(default_factory=Reaper)
    uid: str = field(default_factory=lambda: secrets.token_hex(3))
    nodes: dict[str, Node] = field(default_factory=dict)
    monitor: Service | None = None
    monitor_url: str = ""  # as the nodes see it
    relay_url: str = ""  # a relay in front of the monitor (start_relay), as the nodes see it
    monitor_uds: str = ""  # for this process
    _namespaces: list[str] = field(default_factory=list)
    _closed: bool = False

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.switch_ns = f"{NS_PREFIX}{owner_tag()}-{self.uid}-sw"

    # -- building

    def _add_ns(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def create(self) -> Fabric:
        check_available()
        sweep_stale()
        atexit.register(self.close)
        self._add_ns(self.switch_ns)
        _run("ip", "-n", self.switch_ns, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch_ns, "addr", "add", f"{SWITCH_ADDR}/{PREFIX}", "dev", "br0")
        _run("ip", "-n", self.switch_ns, "link", "set", "br0", "up")
        return self

    def add_node(self, letter: str, *, host: int | None = None, start: bool = True) -> Node:
        """Node ``node-<letter>`` at 10.231.0.<host> (default a=1, b=2, ...), with its own pid namespace.

        Which side of a gloo pair connects depends on the addresses (the peer with the larger
        address connects, seen on torch 2.13): give the master the larger address to make it
        dial the worker, as in the firewall case.
        """
        n = host if host is not None else ord(letter) - ord("a") + 1
        ns = f"{NS_PREFIX}{owner_tag()}-{self.uid}-{letter}"
        node = Node(f"node-{letter}", ns, f"{SUBNET}.{n}", self, veth_switch_side=f"p{letter}")
        self._add_ns(ns)
        sw = self.switch_ns
        _run("ip", "-n", sw, "link", "add", node.veth_switch_side, "type", "veth", "peer", "name", node.ifname,
             "netns", ns)
        _run("ip", "-n", sw, "link", "set", node.veth_switch_side, "master", "br0")
        _run("ip", "-n", sw, "link", "set", node.veth_switch_side, "up")
        _run("ip", "-n", ns, "addr", "add", f"{node.addr}/{PREFIX}", "dev", node.ifname)
        _run("ip", "-n", ns, "link", "set", node.ifname, "up")
        self.nodes[node.name] = node
        # Nodes resolve each other's names (those added so far), like hosts of a cluster.
        write_hosts(ns, {n.name: n.addr for n in self.nodes.values()})
        if start:
            self.start_node(node)
        return node

    def start_node(self, node: Node) -> None:
        node.init = self.reaper.popen(["ip", "netns", "exec", node.ns, "unshare", "--pid", "--fork",
                                       "--mount-proc", "--kill-child", *SELF, "init"],
                                      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                kids = psutil.Process(node.init.pid).children()
            except psutil.NoSuchProcess:
                kids = []
            if kids:
                node.init_pid = kids[0].pid
                self.reaper.adopt(node.init_pid)
                # nsenter needs the new /proc mounted; the init has started Python by then.
                if _run("nsenter", f"--target={node.init_pid}", "--pid", "--mount", "--", "true",
                        check=False).returncode == 0:
                    return
            if node.init.poll() is not None:
                raise RuntimeError(f"node {node.name}: unshare exited with {node.init.returncode}")
            time.sleep(0.05)
        raise RuntimeError(f"node {node.name}: init did not start")

    def start_monitor(self, *, port: int = 8787, timeout: float = 30.0) -> Service:
        """The monitor in the switch namespace on 10.231.0.254:port, and the Unix-socket forwarder."""
        log = self.workdir / "monitor.log"
        with open(log, "wb") as out:
            proc = self.reaper.popen(["ip", "netns", "exec", self.switch_ns, tool("hangwatch-monitor"),
                                      "--host", SWITCH_ADDR, "--port", str(port),
                                      "--db", str(self.workdir / "monitor.db")],
                                     stdout=out, stderr=subprocess.STDOUT)
        self.monitor = Service(proc, log, f"http://{SWITCH_ADDR}:{port}")
        self.monitor_url = self.monitor.url
        self.monitor_uds = str(self.workdir / "monitor.sock")
        with open(self.workdir / "proxy.log", "wb") as out:
            self.reaper.popen(["ip", "netns", "exec", self.switch_ns, *SELF,
                               "proxy", self.monitor_uds, SWITCH_ADDR, str(port)],
                              cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"monitor exited with {proc.returncode}:\n{self.monitor.log_tail()}")
            # A raw probe first: httpx leaks the socket of a failed Unix-socket connect.
            if self._monitor_answers(port):
                with httpx.Client(transport=httpx.HTTPTransport(uds=self.monitor_uds), timeout=2.0) as http:
                    try:
                        if http.get(self.monitor_url + "/healthz").status_code == 200:
                            return self.monitor
                    except httpx.HTTPError:
                        pass
            time.sleep(0.1)
        raise RuntimeError(f"monitor not healthy after {timeout}s:\n{self.monitor.log_tail()}")

    def start_relay(self, *extra: str, port: int = 8788, timeout: float = 30.0) -> Service:
        """A relay (hangwatch-relay) in the switch namespace on 10.231.0.254:port, in front of the monitor;
        ``extra``: more of its arguments (``--summarise``, ...)."""
        log = self.workdir / "relay.log"
        with open(log, "wb") as out:
            proc = self.reaper.popen(["ip", "netns", "exec", self.switch_ns, tool("hangwatch-relay"),
                                      "--monitor", self.monitor_url, "--host", SWITCH_ADDR, "--port", str(port),
                                      *extra],
                                     stdout=out, stderr=subprocess.STDOUT)
        relay = Service(proc, log, f"http://{SWITCH_ADDR}:{port}")
        self.relay_url = relay.url
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"relay exited with {proc.returncode}:\n{relay.log_tail()}")
            if b"Uvicorn running" in log.read_bytes():
                return relay
            time.sleep(0.1)
        raise RuntimeError(f"relay not serving after {timeout}s:\n{relay.log_tail()}")

    def in_switch(self, *cmd: str) -> subprocess.CompletedProcess:
        """A short command in the switch namespace (where the monitor and any relay listen)."""
        return _run("ip", "netns", "exec", self.switch_ns, *cmd, check=False)

    def _monitor_answers(self, port: int) -> bool:
        """The forwarder accepts and the monitor behind it answers an HTTP request."""
        import socket

        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2.0)
                s.connect(self.monitor_uds)
                s.sendall(f"GET /healthz HTTP/1.0\r\nHost: {SWITCH_ADDR}:{port}\r\n\r\n".encode())
                return s.recv(16).startswith(b"HTTP/")
        except OSError:
            return False

    # -- teardown

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for node in self.nodes.values():
                if node.init_pid:
                    try:
                        os.kill(node.init_pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self.reaper.close()
        finally:
            for ns in reversed(self._namespaces):
                delete_namespace(ns)
            self._namespaces.clear()
            try:
                atexit.unregister(self.close)
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> Fabric:
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()

    def context(self) -> str:
        """Logs and sockets of every node, for a failing test's message."""
        parts = []
        for node in self.nodes.values():
            if node.agent:
                parts.append(f"agent {node.name}:\n{node.agent.log_tail(12)}")
            if node.init_pid:
                parts.append(f"sockets {node.name}:\n{node.tcp_sockets()}")
        if self.monitor:
            parts.append(f"monitor:\n{self.monitor.log_tail(12)}")
        return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["init"]:
        return _init_main()
    if argv[:1] == ["proxy"] and len(argv) == 4:
        return _proxy_main(argv[1], argv[2], int(argv[3]))
    if argv[:1] == ["sweep"]:
        for ns in sweep_stale():
            print(f"deleted {ns}")
        return 0
    print("usage: python -m tests.netns init | proxy UDS HOST PORT | sweep", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
