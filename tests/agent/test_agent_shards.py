"""Sharding (agent/shards.py): which monitor owns a job and how a node's report is split; then the
senders (agent/sender.py) against real monitor stand-ins on loopback: routing, 503 + Retry-After,
and deltas once the monitor says it takes them."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from agent.sender import Sender, ShardedSender
from agent.shards import owner, split
from monitor.ingest.wire import Report
from tests.agent.conftest import Receiver
from tests.monitor.monitor_reports import launcher, orphan, rank, report, stack

M2 = ["http://monitor-a:8080", "http://monitor-b:8080"]
M3 = M2 + ["http://monitor-c:8080"]
JOBS = [f"job-{i}" for i in range(200)]
NODE_LEVEL = ("schema_version", "node", "sent_at", "agent", "host", "collectors", "orphans")


def owned_by(monitor: str, monitors: list[str], prefix: str = "job") -> str:
    """The first ``{prefix}-N`` that ``monitor`` owns among ``monitors``."""
    for i in range(10_000):
        name = f"{prefix}-{i}"
        if owner(name, monitors) == monitor:
            return name
    raise AssertionError(f"{monitor} owns no {prefix}-N")


def ranks_of(job_id: str, first_pid: int, count: int = 2) -> list[dict]:
    return [rank(job_id, rank=i, world_size=count, pid=first_pid + i) for i in range(count)]


def node_report(ranks: list[dict], launchers: list[dict] = (), node: str = "node-a") -> dict:
    return report(node=node, ranks=ranks, launchers=list(launchers), orphans=[orphan(4242, ports=[29500])])


def jobs_in(part: dict) -> set[str]:
    return {r["job_id"] for r in part["ranks"]}


def launcher_pids(part: dict) -> list[int]:
    return [launcher["pid"] for launcher in part["launchers"]]


# --- owner ------------------------------------------------------------------------------------


def test_owner_is_deterministic_and_ignores_the_order_of_monitors():
    first = [owner(job, M3) for job in JOBS]
    assert first == [owner(job, M3) for job in JOBS]
    assert first == [owner(job, list(reversed(M3))) for job in JOBS]
    assert set(first) <= set(M3)


def test_owner_spreads_jobs_over_the_monitors():
    counts = Counter(owner(job, M2) for job in JOBS)
    assert set(counts) == set(M2)
    assert min(counts.values()) >= 60, counts


def test_a_new_monitor_takes_only_the_jobs_it_wins():
    moved = [job for job in JOBS if owner(job, M2) != owner(job, M3)]
    won = [job for job in JOBS if owner(job, M3) == M3[2]]
    assert moved == won
    assert len(won) >= 40  # it does take its share


# --- split ------------------------------------------------------------------------------------


def test_one_monitor_gets_the_report_itself():
    full = node_report(ranks_of("job-x", 1000), [launcher(None, worker_pids=[1000])])
    parts = split(full, M2[:1])
    assert list(parts) == M2[:1] and parts[M2[0]] is full


def test_ranks_go_to_their_jobs_owner():
    job_a, job_b = owned_by(M2[0], M2), owned_by(M2[1], M2)
    ranks_a, ranks_b = ranks_of(job_a, 1000), ranks_of(job_b, 2000)
    parts = split(node_report(ranks_a + ranks_b), M2)
    assert parts[M2[0]]["ranks"] == ranks_a
    assert parts[M2[1]]["ranks"] == ranks_b


def test_a_launcher_that_names_its_job_goes_to_the_jobs_owner():
    job_a, job_b = owned_by(M2[0], M2), owned_by(M2[1], M2)
    full = node_report(ranks_of(job_a, 1000), [launcher(job_b, pid=900)])
    parts = split(full, M2)
    assert launcher_pids(parts[M2[1]]) == [900]
    assert launcher_pids(parts[M2[0]]) == []


@pytest.mark.parametrize(
    "worker_pids, expected",
    [
        ([2000, 2001], {1}),  # its workers are job_b's ranks
        ([1000, 2000], {0, 1}),  # workers in both jobs
        ([2000, 7777], {1}),  # an unknown pid does not widen it
    ],
    ids=["one job", "two jobs", "unknown pid ignored"],
)
def test_a_launcher_without_job_goes_where_its_workers_went(worker_pids, expected):
    job_a, job_b = owned_by(M2[0], M2), owned_by(M2[1], M2)
    jobless = launcher(None, pid=900, worker_pids=worker_pids)
    full = node_report(ranks_of(job_a, 1000) + ranks_of(job_b, 2000), [jobless])
    parts = split(full, M2)
    assert {i for i, m in enumerate(M2) if launcher_pids(parts[m]) == [900]} == expected
    assert all(launcher_pids(parts[m]) == [] for i, m in enumerate(M2) if i not in expected)


@pytest.mark.parametrize("worker_pids", [[], [7777]], ids=["no workers", "unknown workers"])
def test_a_launcher_without_job_or_known_workers_goes_to_every_monitor(worker_pids):
    parts = split(node_report([], [launcher(None, pid=900, worker_pids=worker_pids)]), M3)
    assert set(parts) == set(M3)
    assert all(launcher_pids(part) == [900] for part in parts.values())


def test_node_level_facts_go_with_every_part():
    ranks = [r for i, m in enumerate(M3) for r in ranks_of(owned_by(m, M3), 1000 * (i + 1))]
    full = node_report(ranks)
    parts = split(full, M3)
    assert set(parts) == set(M3)
    for part in parts.values():
        for key in NODE_LEVEL:
            assert part[key] == full[key], key
        assert part["orphans"] and part["host"]


def test_the_node_names_owner_gets_a_part_without_jobs():
    node = owned_by(M2[0], M2, prefix="node")
    job_b = owned_by(M2[1], M2)
    full = node_report(ranks_of(job_b, 2000), node=node)
    parts = split(full, M2)
    assert set(parts) == set(M2)
    mine = parts[M2[0]]
    assert mine["ranks"] == [] and mine["launchers"] == []
    assert all(mine[key] == full[key] for key in NODE_LEVEL)
    assert jobs_in(parts[M2[1]]) == {job_b}


def test_a_monitor_with_nothing_of_the_node_gets_nothing():
    node = owned_by(M3[0], M3, prefix="node")
    job = owned_by(M3[0], M3)
    parts = split(node_report(ranks_of(job, 1000), [launcher(job, pid=900)], node=node), M3)
    assert list(parts) == [M3[0]]


def test_split_leaves_the_report_alone():
    job_a, job_b = owned_by(M2[0], M2), owned_by(M2[1], M2)
    full = node_report(ranks_of(job_a, 1000) + ranks_of(job_b, 2000), [launcher(None, worker_pids=[1000])])
    before = copy.deepcopy(full)
    split(full, M2)
    assert full == before


# --- the senders against loopback monitors ----------------------------------------------------


@pytest.fixture
def serve() -> Iterator[Callable[[], Receiver]]:
    """Starts monitor stand-ins on demand; all are closed at the end."""
    started: list[Receiver] = []

    def start() -> Receiver:
        started.append(Receiver())
        return started[-1]

    try:
        yield start
    finally:
        for monitor in started:
            monitor.close()


def test_sharded_sender_posts_each_jobs_ranks_to_its_owner_only(serve):
    monitors = [serve(), serve()]
    urls = [m.url for m in monitors]
    job_a, job_b = owned_by(urls[0], urls), owned_by(urls[1], urls)
    sender = ShardedSender(urls)
    try:
        assert sender.post(node_report(ranks_of(job_a, 1000) + ranks_of(job_b, 2000))) is True
    finally:
        sender.close()
    assert [len(m.reports) for m in monitors] == [1, 1]
    assert jobs_in(monitors[0].reports[0]) == {job_a}
    assert jobs_in(monitors[1].reports[0]) == {job_b}
    assert sender.sent == 2 and sender.failed == 0


def test_sender_honours_503_with_retry_after(serve):
    monitor = serve()
    monitor.status, monitor.headers = 503, {"Retry-After": "2"}
    sender = Sender(monitor.url)
    try:
        assert sender.post(node_report(ranks_of("job-x", 1000))) is False
        assert sender.retry_after == 2.0
        assert sender.failed == 1 and sender.sent == 0
        assert len(monitor.reports) == 1  # it was posted, and refused
        # Once the monitor takes reports again, nothing is left to wait for.
        monitor.status, monitor.headers = 200, {}
        assert sender.post(node_report(ranks_of("job-x", 1000))) is True
        assert sender.retry_after is None and sender.sent == 1
    finally:
        sender.client.close()


@pytest.mark.parametrize(
    "status, header",
    [(503, "600"), (503, "Wed, 21 Oct 2015 07:28:00 GMT"), (500, "2")],
    ids=["too long", "a date", "500"],
)
def test_sender_waits_only_on_a_usable_retry_after(serve, status, header):
    monitor = serve()
    monitor.status, monitor.headers = status, {"Retry-After": header}
    sender = Sender(monitor.url)
    try:
        assert sender.post(node_report(ranks_of("job-x", 1000))) is False
        assert sender.retry_after is None
    finally:
        sender.client.close()


def test_sender_sends_deltas_once_the_monitor_takes_them(serve):
    monitor = serve()
    monitor.answer = {"delta": True}
    sender = Sender(monitor.url)
    ranks = [rank("job-x", pid=1000, stack=stack(100.0), sockets=[], env={"MASTER_PORT": "29500"})]
    try:
        assert sender.post(node_report(copy.deepcopy(ranks))) is True
        assert sender.post(node_report(copy.deepcopy(ranks))) is True
    finally:
        sender.client.close()
    full, delta = monitor.reports
    assert "delta" not in full and full["host"] is not None and full["ranks"][0]["stack"] is not None
    assert delta["delta"] is True and delta["host"] is None
    assert delta["ranks"][0]["stack"] is None and delta["ranks"][0]["env"] == {}
    assert Report.model_validate(delta).delta is True
