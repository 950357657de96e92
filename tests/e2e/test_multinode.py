"""Two simulated nodes (tests/netns.py): network namespaces on a bridge, one PID namespace,
one agent and one torchrun per node, the monitor in the switch namespace.

node-a (10.231.0.20) is the master (node rank 0, rank 0, TCPStore on MASTER_PORT); node-b
(10.231.0.10) is the worker (node rank 1, rank 1). The master has the larger address so that
it is the side of the gloo pair that dials (gloo: the peer with the larger address connects),
as with the field's master .36 / worker .28: the worker's firewall then drops the master's
gloo connection.

Everything (namespaces, the bridge, veths, iptables rules and qdiscs inside the namespaces,
every process) is removed when a test ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.demo.harness import MonitorClient, Observation
from tests.e2e.answers import compact, text_of
from tests.netns import Fabric, NetnsUnavailable, check_available, sweep_stale

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MASTER_PORT = 29500  # each fabric has its own network: no clash with anything else
MASTER_HOST, WORKER_HOST = 20, 10
GLOO_OK = {"GLOO_SOCKET_IFNAME": "eth0"}
# A relay that summarises every job, the two-rank one too (by default only those of 512 ranks or more).
SUMMARISE_EVERY_JOB = ("--summarise", "--summarise-ranks", "1")
# The relay's counts: summaries the monitor took; node-b's reports answered by the relay, and forwarded ones.
SUMMARIES_SENT = ("hangwatch_relay_summaries_total", (("outcome", "sent"),))
RELAY_ANSWERS = ("hangwatch_relay_answer_seconds_count", ())
FORWARDED = ("hangwatch_relay_reports_total", (("outcome", "answered"), ("reason", "")))
# Rank 1 leaves the loop at step 120: 6 s or more of training (each step sleeps 50 ms), longer than the
# monitor takes to call a silent job stalled (monitor/diagnosis/cadence.py), the job healthy all the while.
LINGER_AFTER_TRAINING = ("--steps", "100000", "--fail", "linger", "--fail-rank", "1", "--fail-at-step", "120")


@pytest.fixture(scope="session", autouse=True)
def _sweep_namespaces_at_session_end() -> Iterator[None]:
    yield
    sweep_stale()


class Cluster:
    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.a = fabric.add_node("a", host=MASTER_HOST)
        self.b = fabric.add_node("b", host=WORKER_HOST)
        self.client = MonitorClient(fabric.monitor_url, uds=fabric.monitor_uds)
        self.job_id = f"{self.a.addr}:{MASTER_PORT}"
        self.jobs: dict[str, object] = {}

    def start_agents(self, b_reports_to: str | None = None) -> None:
        self.a.start_agent(self.fabric.monitor_url)
        self.b.start_agent(b_reports_to or self.fabric.monitor_url)

    def launch(self, node, node_rank: int, *train_args: str, env: dict[str, str] | None = None,
               master_addr: str | None = None):
        job = node.torchrun(list(train_args), nnodes=2, node_rank=node_rank, master_addr=master_addr or self.a.addr,
                            master_port=MASTER_PORT, env=GLOO_OK if env is None else env)
        self.jobs[node.name] = job
        return job

    def context(self) -> str:
        parts = [f"--- {name} log\n{job.log_tail(15)}" for name, job in self.jobs.items()]
        return "\n".join(parts + [self.fabric.context()])

    def wait_for_verdict(self, verdict: str, timeout: float = 60.0, *, culprits=None) -> dict:
        try:
            return self.client.wait_for_verdict(self.job_id, verdict, timeout, culprits=culprits,
                                                context=self.context)
        except AssertionError as e:
            pytest.fail(str(e), pytrace=False)

    def watch(self, seconds: float, poll: float = 0.5) -> list[dict | None]:
        seen = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seen.append(self.client.job(self.job_id))
            time.sleep(poll)
        return seen


@contextlib.contextmanager
def two_nodes(tmp_path: Path, *, relay_for_b: Sequence[str] | None = None,
              before_agents: Callable[[Cluster], None] | None = None) -> Iterator[Cluster]:
    """Two nodes and their monitor; ``before_agents`` runs once the monitor is up, before the agents start;
    ``relay_for_b``: node-b's agent posts to a relay started with these arguments (none: to the monitor)."""
    try:
        check_available("iptables", "tc")
    except NetnsUnavailable as e:
        pytest.fail(f"multi-node tests need network namespaces: {e}")
    fabric = Fabric(tmp_path)
    try:
        fabric.create()
        fabric.start_monitor()
        c = Cluster(fabric)
        if before_agents is not None:
            before_agents(c)
        c.start_agents(b_reports_to=None if relay_for_b is None else fabric.start_relay(*relay_for_b).url)
        yield c
        c.client.close()
    finally:
        fabric.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with two_nodes(tmp_path) as c:
        yield c


def samples(scrape: str) -> dict[tuple[str, tuple], float]:
    """(name, sorted labels) -> value of a /metrics scrape, read with Prometheus' own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(scrape)
            for s in family.samples}


def monitor_samples(c: Cluster) -> dict[tuple[str, tuple], float]:
    """The monitor's /metrics, read through the fabric's Unix socket."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=c.fabric.monitor_uds), timeout=5.0) as http:
        scrape = http.get(c.fabric.monitor_url + "/metrics")
    assert scrape.status_code == 200, scrape.text[:200]
    return samples(scrape.text)


def relay_samples(c: Cluster) -> dict[tuple[str, tuple], float]:
    """The relay's /metrics, read from the switch namespace (where it listens)."""
    scrape = c.fabric.in_switch(sys.executable, "-c", f"import httpx; print(httpx.get('{c.fabric.relay_url}/metrics').text)")
    assert scrape.returncode == 0, scrape.stderr
    return samples(scrape.stdout)


def relay_log(c: Cluster) -> str:
    lines = (c.fabric.workdir / "relay.log").read_text(errors="replace").splitlines()
    return "\nrelay:\n" + "\n".join(lines[-12:])


def syn_sent(node) -> list[tuple[str, int]]:
    """(peer address, peer port) of the node's SYN-SENT sockets."""
    out = []
    for line in node.tcp_sockets().splitlines():
        if line.startswith("SYN-SENT"):
            peer = line.split()[4]
            addr, _, port = peer.rpartition(":")
            out.append((addr.strip("[]").removeprefix("::ffff:"), int(port)))
    return out


def test_two_nodes_healthy(cluster: Cluster):
    cluster.launch(cluster.a, 0, "--steps", "100000", "--log-all-ranks")
    cluster.launch(cluster.b, 1, "--steps", "100000", "--log-all-ranks")
    cluster.jobs["node-a"].wait_for_step(20, timeout=60)
    got = cluster.wait_for_verdict("healthy", culprits=[])
    assert sorted(got["nodes"]) == ["node-a", "node-b"], compact(got)
    assert {(r["rank"], r["node"]) for r in got["ranks"]} == {(0, "node-a"), (1, "node-b")}, compact(got)
    bad = [j for j in cluster.watch(10) if j is None or j["verdict"] != "healthy"]
    assert not bad, compact(bad[0])


def test_a_deadlock_is_named_when_one_node_reports_through_a_summarising_relay(tmp_path: Path):
    """node-b's agent posts to a summarising relay (hangwatch-relay --summarise, every job summarised), node-a's
    to the monitor itself: rank 1 reaches the monitor only in the relay's summaries, and the job's deadlock and
    culprit are named as when both post directly; healthy while the job trains, never deadlock before rank 1
    leaves the loop.

    The forwarding relay (no --summarise) in front of the real monitor: tests/monitor/test_relay.py, and with
    the agent's sender, tests/agent/test_outage_journal.py."""
    with two_nodes(tmp_path, relay_for_b=SUMMARISE_EVERY_JOB) as c:
        trains = c.launch(c.a, 0, *LINGER_AFTER_TRAINING)
        lingers = c.launch(c.b, 1, *LINGER_AFTER_TRAINING)
        # The relay's counts once the monitor lists rank 1: node-b's reports from before its job started
        # (none of a job to summarise) went on to the monitor; none of them may from then on.
        listed: list[dict[tuple[str, tuple], float]] = []
        trained_at: list[float] = []  # when rank 0's log first showed a step

        def note(job: dict | None) -> None:
            if not listed and job and any(r["rank"] == 1 for r in job["ranks"]):
                listed.append(relay_samples(c))
            if not trained_at and "step 1/" in trains.text():
                trained_at.append(time.time())

        seen: list[Observation] = []
        try:
            got = c.client.wait_for_verdict(c.job_id, "deadlock", timeout=90, culprits=[1], observations=seen,
                                            on_poll=note, context=lambda: c.context() + relay_log(c))
        except AssertionError as e:
            pytest.fail(str(e), pytrace=False)
        assert {(r["rank"], r["node"]) for r in got["ranks"]} == {(0, "node-a"), (1, "node-b")}, compact(got)
        assert sorted(got["culprit_ranks"]) == [1], compact(got)
        stalled_at = lingers.stall_time()
        assert stalled_at is not None, lingers.log_tail(15)
        before = [o.verdict for o in seen if o.at < stalled_at]
        assert "deadlock" not in before, f"before rank 1 left the loop: {before}"
        training = [o.verdict for o in seen if trained_at and trained_at[0] <= o.at < stalled_at]
        assert training and set(training) == {"healthy"}, f"while the job trained: {training}"

        relay, monitor = relay_samples(c), monitor_samples(c)
        [at_listing] = listed
        # node-b's agent went on reporting to the relay (about once a second), and the relay kept them all.
        counts = {name: (at_listing.get(key), relay.get(key)) for name, key in
                  (("reports in", RELAY_ANSWERS), ("forwarded", FORWARDED), ("summaries", SUMMARIES_SENT))}
        assert relay[RELAY_ANSWERS] - at_listing[RELAY_ANSWERS] >= 5, counts
        assert relay[FORWARDED] == at_listing[FORWARDED], counts
        assert relay.get(SUMMARIES_SENT, 0) > 0, counts
        assert monitor[("hangwatch_monitor_summaries_total", ())] > 0, monitor
        assert [v for (name, _), v in monitor.items() if name == "hangwatch_monitor_relay_nodes"] == [1.0], monitor
        print(f"summarising relay: healthy while training {stalled_at - trained_at[0]:.1f}s, deadlock named "
              f"{seen[-1].at - stalled_at:.1f}s after it; relay counts (at listing, at the end) {counts}")


def test_master_named_by_address_on_one_node_and_by_name_on_the_other_is_one_job(cluster: Cluster):
    """node-a's torchrun says --master-addr=10.231.0.20, node-b's says --master-addr=node-a (its
    hosts file): two job ids for one rendezvous, shown as one job under either id."""
    cluster.launch(cluster.a, 0, "--steps", "100000")
    cluster.launch(cluster.b, 1, "--steps", "100000", master_addr="node-a")
    cluster.jobs["node-a"].wait_for_step(10, timeout=60)
    got = cluster.wait_for_verdict("healthy", culprits=[])
    named = f"node-a:{MASTER_PORT}"
    assert {got["job_id"], *got["aliases"]} == {cluster.job_id, named}, compact(got)
    assert {(r["rank"], r["node"]) for r in got["ranks"]} == {(0, "node-a"), (1, "node-b")}, compact(got)
    listed = cluster.client.diagnose()["jobs"]
    assert [j["job_id"] for j in listed] == [got["job_id"]], [j["job_id"] for j in listed]
    assert cluster.client.job(named)["job_id"] == got["job_id"]


def test_worker_firewall_drops_master_gloo_connections(cluster: Cluster):
    """Worker's INPUT drops new TCP connections from the master to ports >= 1024 except MASTER_PORT's
    direction (the worker dials the master's store; the master's gloo dial to the worker is dropped)."""
    a, b = cluster.a, cluster.b
    b.iptables("-A", "INPUT", "-s", a.addr, "-p", "tcp", "--dport", "1024:65535", "-m", "conntrack",
               "--ctstate", "NEW", "-j", "DROP")
    cluster.launch(a, 0, "--steps", "100000")
    cluster.launch(b, 1, "--steps", "100000")
    # Rank 1 named: on a loaded machine the launchers can still be meeting when the first reading
    # comes ("launchers wait and no workers start", no culprit), before the gloo dial that hangs.
    got = cluster.wait_for_verdict("rendezvous_hang", timeout=90, culprits=[1])
    # gloo dials again after each connect attempt times out: between two, nothing is in SYN-SENT
    # (a CI run once read the sockets in such a gap).
    deadline = time.monotonic() + 30
    while not (pending := syn_sent(a)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pending and all(addr == b.addr for addr, _ in pending), a.tcp_sockets()
    text = text_of(got)
    assert "node-a" in text and "node-b" in text, compact(got)
    assert b.addr in text, compact(got)
    assert any(str(port) in text for _, port in pending), (pending, compact(got))
    assert "SYN" in text.upper(), compact(got)
    hints = " ".join(got["hints"])
    assert "GLOO_PORT_RANGE" in hints and "firewall" in hints.lower(), compact(got)
    assert sorted(got["culprit_ranks"]) == [1], compact(got)


def test_gloo_bound_to_an_unreachable_interface(cluster: Cluster):
    """GLOO_SOCKET_IFNAME on the worker names a virtual NIC (a bridge ``docker0``, 10.230.0.10/24,
    no ports) that the master cannot route to. (``dummy`` links are not available in this
    kernel; a bridge with no ports serves.)

    Seen on torch 2.13: the master's rank 0 dials 10.230.0.10 and fails at once in
    init_process_group with ``connect: Network is unreachable`` (gloo socket.cc:142), exits 1,
    and its torchrun ends; rank 1 on node-b stays in init_process_group (0% CPU) with its
    store connections in CLOSE-WAIT. The cause is node-b's interface choice, whatever the
    verdict word: the hint must name GLOO_SOCKET_IFNAME and the evidence docker0 / node-b.
    """
    b = cluster.b
    b.sh("ip", "link", "add", "docker0", "type", "bridge")
    b.sh("ip", "addr", "add", "10.230.0.10/24", "dev", "docker0")
    b.sh("ip", "link", "set", "docker0", "up")
    cluster.launch(cluster.a, 0, "--steps", "100000")
    cluster.launch(b, 1, "--steps", "100000", env={"GLOO_SOCKET_IFNAME": "docker0"})
    end = time.monotonic() + 60
    got = None
    while time.monotonic() < end:
        got = cluster.client.job(cluster.job_id)
        if got and got["verdict"] in ("rank_exited", "rendezvous_hang") and \
                "GLOO_SOCKET_IFNAME" in " ".join(got["hints"]):
            break
        time.sleep(0.5)
    assert got and got["verdict"] in ("rank_exited", "rendezvous_hang"), compact(got) + cluster.context()
    text = text_of(got)
    assert "GLOO_SOCKET_IFNAME" in " ".join(got["hints"]), compact(got)
    assert "docker0" in text or "10.230.0.10" in text, compact(got)
    assert "node-b" in text, compact(got)
    assert "Network is unreachable" in text, compact(got)


def test_node_never_joined(cluster: Cluster):
    """Only node-a starts: its launcher waits for node rank 1 with no workers."""
    cluster.launch(cluster.a, 0, "--steps", "100000")
    got = cluster.wait_for_verdict("rendezvous_hang", timeout=60)
    text = text_of(got)
    assert re.search(r"node[ _-]?rank(\(s\))? 1\b|1 of 2 nodes", text, re.I), compact(got)
    assert "node-a" in text, compact(got)


def test_slow_link_is_healthy(cluster: Cluster):
    """4 Mbit/s both ways (tbf on each node's eth0) and a model whose all_reduce dominates the
    step: bytes are moving, so healthy, never deadlock; the collective share is reported."""
    for node in (cluster.a, cluster.b):
        node.tc("qdisc", "add", "dev", node.ifname, "root", "tbf", "rate", "4mbit", "burst", "32kbit",
                "latency", "400ms")
    args = ("--steps", "100000", "--hidden", "384", "--step-sleep", "0")
    cluster.launch(cluster.a, 0, *args)
    cluster.launch(cluster.b, 1, *args)
    cluster.jobs["node-a"].wait_for_step(3, timeout=90)
    seen = cluster.watch(20)

    def shares_of(answers: list[dict]) -> list[float]:
        return [r["collective_wait_share"] for j in answers for r in j["ranks"]
                if r.get("collective_wait_share") is not None]

    # The share needs a few stacks of each rank; on a loaded machine they come slower: watch on
    # (healthy all the while) until it is reported, for 40 s more at most.
    deadline = time.monotonic() + 40
    while not shares_of([j for j in seen[-10:] if j is not None]) and time.monotonic() < deadline:
        seen += cluster.watch(2)
    listed = [j for j in seen if j is not None]
    assert listed, "the monitor never listed the job"
    bad = [j for j in listed if j["verdict"] != "healthy"]
    assert not bad, f"verdicts: {[j['verdict'] for j in listed]}\nfirst wrong:\n{compact(bad[0])}"
    shares = shares_of(listed[-10:])
    assert shares and max(shares) > 0.5, f"collective wait share not reported high: {shares}\n{compact(listed[-1])}"
