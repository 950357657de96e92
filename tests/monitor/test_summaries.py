"""A giant job judged from summarising relays' summaries (monitor/ingest/summary_*.py,
monitor/engine/summaries.py): the same verdict and culprit as from its reports, a handful of
groups on the wire, every rank back at the owner, bad summaries refused whole, a silent relay's
ranks never read as live.

Each relay side here is a real monitor app fed the nodes' reports (what ``hangwatch-relay
--summarise`` keeps); its summary is posted to the owner's real app over its route."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from monitor_reports import frame, rank, report, stack
from monitor_testkit import FakeClock, TestClient, monitor_of, post_report

from monitor.engine.views import job_view
from monitor.ingest.summary_book import RELAY_SILENT_S
from monitor.ingest.summary_groups import expand, group_key, job_summary
from monitor.ingest.summary_wire import MEMBER_FIELDS, Summary, encode_summary
from monitor.storage.store import open_store
from monitor.web.app import create_app
from monitor.web.settings import Settings

JOB = "10.0.0.1:29500"
NODES = 16
PER_NODE = 8
RANKS = NODES * PER_NODE
CULPRIT = 77
LINGER = [frame("main", "/work/train.py", 131), frame("<module>", "/work/train.py", 160)]


def node_report(clock: FakeClock, node: int) -> dict[str, Any]:
    """A node's report: its ranks idle in all_reduce, but the culprit, idle in the user's code."""
    ranks = [rank(job_id=JOB, rank=r, world_size=RANKS, pid=10_000 + r, cpu_percent=0.5,
                  stack=stack(clock.now - 0.5, frames=LINGER if r == CULPRIT else None))
             for r in range(node * PER_NODE, node * PER_NODE + PER_NODE)]
    return report(node=f"node-{node:03d}", ranks=ranks, sent_at=clock.now)


@pytest.fixture
def relay_apps(settings: Settings, clock: FakeClock, tmp_path: Path) -> Iterator[list[TestClient]]:
    """Two relay sides: real monitor apps, each taking half the nodes' reports."""
    clients, stores = [], []
    for name in ("relay-a", "relay-b"):
        relay_settings = dataclasses.replace(settings, db=tmp_path / f"{name}.db")
        stores.append(open_store(relay_settings, clock))
        clients.append(TestClient(create_app(relay_settings, stores[-1], clock=clock)).__enter__())
    yield clients
    for client, store in zip(clients, stores):
        client.__exit__(None, None, None)
        store.close()


def summary_of(relay: TestClient, name: str, clock: FakeClock) -> Summary:
    """What a summarising relay sends: its giant job's share, grouped."""
    local = monitor_of(relay)
    node_index: dict[str, int] = {}
    with local._lock:
        state = local._state
        jobs = [job_summary(job_view(job, state.nodes, clock.now, local.started_at), node_index, job.last_report_at,
                            job.last_progress_at, job.lifecycle_revision) for job in state.jobs.values()]
    return Summary(relay=name, sent_at=clock.now, started_at=local.started_at, nodes=list(node_index), jobs=jobs)


def feed(relays: list[TestClient], clock: FakeClock, nodes: range = range(NODES)) -> None:
    for node in nodes:
        post_report(relays[node % len(relays)], node_report(clock, node))


def post_summary(owner: TestClient, summary: Summary | bytes) -> Any:
    body = summary if isinstance(summary, bytes) else encode_summary(summary)
    return owner.post("/api/v1/summaries", content=body, headers={"content-type": "application/json"})


def send_summaries(owner: TestClient, relays: list[TestClient], clock: FakeClock) -> list[Summary]:
    summaries = [summary_of(relay, f"relay-{i}", clock) for i, relay in enumerate(relays)]
    for summary in summaries:
        answer = post_summary(owner, summary)
        assert answer.status_code == 202, answer.text
    return summaries


def deadlocked(owner: TestClient, relays: list[TestClient], clock: FakeClock) -> list[Summary]:
    feed(relays, clock)
    send_summaries(owner, relays, clock)
    clock.advance(12)  # idle past the 10 s a job without progress lines may sit parked
    feed(relays, clock)
    return send_summaries(owner, relays, clock)


def job_of(client: TestClient) -> dict[str, Any]:
    answer = client.get("/diagnose", params={"format": "json", "job": JOB})
    assert answer.status_code == 200, answer.text
    [job] = answer.json()["jobs"]
    return job


def test_a_job_known_only_from_summaries_is_judged_as_from_its_reports(
        client: TestClient, relay_apps: list[TestClient], clock: FakeClock) -> None:
    summaries = deadlocked(client, relay_apps, clock)
    job = job_of(client)
    assert (job["verdict"], job["culprit_ranks"], job["ranks_total"]) == ("deadlock", [CULPRIT], RANKS)
    # Few groups on the wire: everyone in all_reduce is one group per relay; the culprit goes whole.
    groups = [g for s in summaries for j in s.jobs for g in j.groups]
    whole = [v.rank for s in summaries for j in s.jobs for v in j.ranks]
    assert len(groups) == 2 and whole == [CULPRIT]
    assert sum(len(g.members) for g in groups) == RANKS - 1


def test_a_job_seen_directly_and_through_a_relay_is_one_job(
        client: TestClient, relay_apps: list[TestClient], clock: FakeClock) -> None:
    """Node 0 posts to the owner itself; the rest are summarised by one relay: one job of every rank."""
    relay = relay_apps[:1]
    for _ in range(2):
        post_report(client, node_report(clock, 0))
        feed(relay, clock, range(1, NODES))
        send_summaries(client, relay, clock)
        clock.advance(12)
    post_report(client, node_report(clock, 0))
    feed(relay, clock, range(1, NODES))
    send_summaries(client, relay, clock)
    job = job_of(client)
    assert (job["verdict"], job["culprit_ranks"], job["ranks_total"]) == ("deadlock", [CULPRIT], RANKS)


def test_a_member_comes_back_as_its_own_view(
        relay_apps: list[TestClient], clock: FakeClock) -> None:
    feed(relay_apps[:1], clock)
    local = monitor_of(relay_apps[0])
    with local._lock:
        view = job_view(local._state.jobs[JOB], local._state.nodes, clock.now, local.started_at)
    node_index: dict[str, int] = {}
    summary = job_summary(view, node_index, clock.now, None, 0)
    wire = msgspec.json.decode(encode_summary(Summary("r", clock.now, clock.now, list(node_index), [summary])),
                               type=Summary)
    by_rank = {v.rank: v for v in view.ranks}
    for group in wire.jobs[0].groups:
        for member in expand(group, wire.nodes):
            original = by_rank[member.rank]
            assert group_key(member) == group_key(original)
            assert [getattr(member, f) for f in MEMBER_FIELDS] == [getattr(original, f) for f in MEMBER_FIELDS]
            assert member.stack == original.stack and member.progress_times == original.progress_times


def test_a_silent_relay_leaves_its_ranks_unknown_never_judged_from_old_reports(
        client: TestClient, relay_apps: list[TestClient], clock: FakeClock) -> None:
    deadlocked(client, relay_apps, clock)
    assert job_of(client)["verdict"] == "deadlock"
    clock.advance(RELAY_SILENT_S + 1)
    feed(relay_apps[:1], clock)
    send_summaries(client, relay_apps[:1], clock)  # relay b went quiet
    job = job_of(client)
    assert job["verdict"] == "unknown", job["summary"]


def _summary_body(relays: list[TestClient], clock: FakeClock) -> dict[str, Any]:
    feed(relays[:1], clock)
    return msgspec.to_builtins(summary_of(relays[0], "relay-a", clock))


def _outside_world(body: dict[str, Any]) -> None:
    body["jobs"][0]["groups"][0]["members"][0][0] = RANKS  # rank == world size


def _unlisted_node(body: dict[str, Any]) -> None:
    body["jobs"][0]["groups"][0]["members"][0][1] = len(body["nodes"])


def _rank_twice(body: dict[str, Any]) -> None:
    members = body["jobs"][0]["groups"][0]["members"]
    members[1][0] = members[0][0]


def _bad_relay_name(body: dict[str, Any]) -> None:
    body["relay"] = "relay a; rm -rf /"


def _huge_world(body: dict[str, Any]) -> None:
    body["jobs"][0]["world_size"] = 10**9


def _not_a_summary(body: dict[str, Any]) -> None:
    body["jobs"] = "all of them"


@pytest.mark.parametrize("spoil, said", [
    (_outside_world, "ranks must lie in"),
    (_unlisted_node, "node index"),
    (_rank_twice, "a rank in two places"),
    (_bad_relay_name, "relay:"),
    (_huge_world, "world size"),
    (_not_a_summary, "not a summary"),
])
def test_a_bad_summary_is_refused_whole_and_changes_nothing(
        client: TestClient, relay_apps: list[TestClient], clock: FakeClock, spoil: Any, said: str) -> None:
    body = _summary_body(relay_apps, clock)
    spoil(body)
    answer = post_summary(client, msgspec.json.encode(body))
    assert answer.status_code == 422 and said in answer.json()["detail"], answer.text
    assert client.get("/diagnose", params={"format": "json"}).json()["jobs"] == []


def test_no_action_acts_on_what_a_summary_says(
        settings: Settings, relay_apps: list[TestClient], clock: FakeClock, tmp_path: Path) -> None:
    """A summary speaks for thousands of ranks from one relay: an action on its culprit is audited
    unattributed, never run (a signal would go to a pid the owner never heard from its node)."""
    actions = tmp_path / "actions.toml"
    actions.write_text('dry_run = false\n[[rule]]\nname = "stop"\nverdicts = ["deadlock"]\nafter_s = 0\n'
                       'signal = "SIGTERM"\n')
    owner_settings = dataclasses.replace(settings, db=tmp_path / "owner.db", actions_file=actions)
    store = open_store(owner_settings, clock)
    try:
        with TestClient(create_app(owner_settings, store, clock=clock)) as owner:
            deadlocked(owner, relay_apps, clock)
            assert job_of(owner)["verdict"] == "deadlock"
            [entry] = owner.get("/api/v1/actions", params={"job": JOB}).json()["actions"]
            assert entry["outcome"] == "unattributed" and "summarising relays" in entry["detail"], entry
    finally:
        store.close()


def test_ranks_alike_on_nodes_of_their_own_cgroups_are_one_group() -> None:
    """A pod per node (Kubernetes) names each node's cgroup: not what the ranks do, so not the group's."""
    from monitor.diagnosis.model import RankView
    from monitor.ingest.summary_groups import group_ranks

    views = [RankView(rank=r, node=f"node-{r // 8}", pid=100 + r, alive=True, observed_at=10.0, first_seen_at=1.0,
                      proc_state="S", cpu_percent=0.5, cgroup=f"/kubepods/burstable/pod-{r // 8}") for r in range(64)]
    node_index: dict[str, int] = {}
    whole, groups = group_ranks(views, node_index)
    assert whole == [] and len(groups) == 1 and len(groups[0].members) == 64
    members = expand(groups[0], list(node_index))
    assert members[0].cgroup is None and {m.node for m in members} == {f"node-{n}" for n in range(8)}


def test_a_rank_whose_view_did_not_change_is_grouped_from_the_last_summary() -> None:
    from monitor.diagnosis.model import RankView
    from monitor.ingest.summary_groups import RowMemo, group_ranks

    views = [RankView(rank=r, node=f"node-{r // 8}", pid=100 + r, alive=True, observed_at=10.0, first_seen_at=1.0,
                      proc_state="S", cpu_percent=0.5) for r in range(32)]
    memo: RowMemo = {}
    first = group_ranks(views, {}, memo)
    assert len(memo) == 32
    assert group_ranks(views, {}, memo) == first  # the same answer, from the memo
    # The nodes listed in another order: each row's node index follows, not the memo's.
    order = {f"node-{n}": 3 - n for n in range(4)}
    _, [group] = group_ranks(views, dict(order), memo)
    assert [list(order)[3 - m.node] for m in group.members] == [v.node for v in views]
    # A rank that reported since has a new view: its own row.
    views[5] = dataclasses.replace(views[5], cpu_percent=0.7)
    _, [group] = group_ranks(views, dict(order), memo)
    assert group.members[5].cpu_percent == 0.7


@pytest.mark.parametrize("clock_behind_s, waits, offset", [
    (0.0, [0.02, 0.03, 1.4], 0.0),  # in step: a summary queued 1.4 s is late, not skewed
    (3.0, [0.02, 0.9, 0.05], 3.02),  # 3 s behind: the least gap is the skew
    (-2.0, [0.3, 0.01, 1.0], -1.99),  # ahead
])
def test_a_relays_clock_is_read_from_its_least_gap(clock_behind_s: float, waits: list[float], offset: float) -> None:
    from monitor.ingest.summary_book import SummaryBook

    book, now = SummaryBook(), 1_000.0
    for wait in waits:
        now += 1.0
        book.take(Summary(relay="r", sent_at=now - wait - clock_behind_s, started_at=0.0, nodes=[]), now)
    assert book._relays["r"].offset == pytest.approx(offset)
