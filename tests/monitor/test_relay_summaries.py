"""A summarising relay (``hangwatch-relay --summarise``, monitor/relay/summariser.py): giant jobs' reports
kept at the relay and sent on as one summary, grouped; other jobs' reports forwarded as before; host
facts sent when they change; and the real relay in front of the real monitor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from monitor_reports import frame, progress, rank, report, socket, stack
from monitor_testkit import FakeClock, TestClient, monitor_of
from real_monitor import metric, running_monitor, running_relay

from monitor.ingest.fastwire import decode_for_forwarding
from monitor.ingest.retention import SILENT_NODE_KEPT_S
from monitor.ingest.summary_wire import Summary, decode_summary, detail_request, encode_summary
from monitor.relay.summariser import Summariser, merge_answer
from monitor.web.routes.ingest import Answer

GIANT = "10.0.0.1:29500"
NODES, PER_NODE = 3, 4
WORLD = NODES * PER_NODE
ODD = 5  # the rank whose stack is elsewhere
ELSEWHERE = [frame("load_batch", "/work/train.py", 131), frame("<module>", "/work/train.py", 160)]


def giant_ranks(clock_now: float, node: int, **fields: Any) -> list[dict[str, Any]]:
    return [rank(job_id=GIANT, rank=r, world_size=WORLD, pid=10_000 + r, cpu_percent=0.5,
                 stack=stack(clock_now - 0.5, frames=ELSEWHERE if r == ODD else None), **fields)
            for r in range(node * PER_NODE, node * PER_NODE + PER_NODE)]


def decoded(body: dict[str, Any]) -> Any:
    """The report as the relay decodes it."""
    report_, _ = decode_for_forwarding(orjson.dumps(body))
    return report_


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def summariser(clock: FakeClock) -> Iterator[Summariser]:
    made = Summariser("relay-a:8788", summarise_ranks=8, clock=clock)
    yield made
    made.close()


def feed(summariser: Summariser, clock: FakeClock, **host: Any) -> None:
    for node in range(NODES):
        body = report(node=f"node-{node}", ranks=giant_ranks(clock.now, node), sent_at=clock.now)
        body["host"].update(host)
        taken = summariser.take(decoded(body), attributed=False)
        assert taken.forward is None and taken.answer["accepted"] is True, taken


def wire(summary: Summary | None) -> Summary:
    """The summary as the owner reads it."""
    assert summary is not None
    return decode_summary(encode_summary(summary))


def test_a_giant_job_becomes_one_summary_of_groups_and_no_report_goes_on(
        summariser: Summariser, clock: FakeClock) -> None:
    clock.advance(1)
    feed(summariser, clock)
    summary = wire(summariser.summary())
    assert (summary.relay, summary.nodes) == ("relay-a:8788", ["node-0", "node-1", "node-2"])
    [job] = summary.jobs
    assert (job.job_id, job.world_size) == (GIANT, WORLD)
    # Ranks alike share a group; the odd one out goes whole, with its own stack.
    [group] = job.groups
    assert sorted(m.rank for m in group.members) == [r for r in range(WORLD) if r != ODD]
    assert [v.rank for v in job.ranks] == [ODD]
    assert job.ranks[0].stack is not None and job.ranks[0].stack.frames[0].name == "load_batch"
    # Each member's node is its own, by index into the summary's nodes.
    assert {m.rank: summary.nodes[m.node] for m in group.members}[9] == "node-2"


def test_a_report_of_a_small_job_and_a_giant_one_forwards_the_small_jobs_ranks_only(
        summariser: Summariser, clock: FakeClock) -> None:
    small = [rank(job_id="small", rank=0, world_size=2)]
    body = report(node="node-0", ranks=giant_ranks(clock.now, 0) + small, sent_at=clock.now, seq=1)
    taken = summariser.take(decoded(body), attributed=False)
    assert taken.answer is None and taken.forward is not None
    assert [(r.job_id, r.rank) for r in taken.forward.ranks] == [("small", 0)]
    # Applied here once the owner took its part: the giant job's ranks reach the summary.
    assert summariser.summary() is None
    assert summariser.apply(taken, attributed=False)["ranks"] == 5
    [job] = wire(summariser.summary()).jobs
    assert (job.job_id, sorted(v.rank for v in job.ranks)) == (GIANT, list(range(PER_NODE)))
    # A report of small jobs only goes on whole.
    alone = decoded(report(node="node-9", ranks=small, sent_at=clock.now))
    assert summariser.take(alone, attributed=False).forward is alone


def test_a_forwarded_report_the_owner_did_not_take_is_news_when_it_comes_again(
        summariser: Summariser, clock: FakeClock) -> None:
    small = [rank(job_id="small", rank=0, world_size=2)]
    body = report(node="node-0", ranks=giant_ranks(clock.now, 0) + small, sent_at=clock.now, seq=1)
    summariser.take(decoded(body), attributed=False)  # the owner was down: not applied
    clock.advance(5)
    replayed = summariser.take(decoded({**body, "replayed": True}), attributed=False)  # from the outage journal
    assert replayed.forward is not None and replayed.forward.replayed
    assert summariser.apply(replayed, attributed=False)["accepted"] is True
    assert wire(summariser.summary()).jobs[0].job_id == GIANT


def test_a_report_without_ranks_goes_on_unless_its_node_runs_giant_jobs_only(
        summariser: Summariser, clock: FakeClock) -> None:
    feed(summariser, clock)
    clock.advance(1)
    bare = decoded(report(node="node-0", ranks=[], sent_at=clock.now))
    assert summariser.take(bare, attributed=False).forward is None
    stranger = decoded(report(node="node-7", ranks=[], sent_at=clock.now))
    assert summariser.take(stranger, attributed=False).forward is stranger


def test_a_report_the_monitor_would_refuse_is_refused_at_the_relay(summariser: Summariser, clock: FakeClock) -> None:
    refused: list[str] = []
    summariser.on_refused = refused.append
    body = report(node="node-0", ranks=giant_ranks(clock.now, 0), sent_at=clock.now, seq=5)
    summariser.take(decoded(body), attributed=False)
    with pytest.raises(Answer) as again:
        summariser.take(decoded(body), attributed=False)
    assert again.value.status == 409 and again.value.body["accepted"] is False
    assert refused == ["stale"]


def test_hosts_go_on_the_first_summary_then_when_they_change_and_all_again_when_asked(
        summariser: Summariser, clock: FakeClock) -> None:
    feed(summariser, clock)
    first = wire(summariser.summary())
    assert (sorted(first.hosts), first.hosts_full) == (["node-0", "node-1", "node-2"], True)
    assert first.hosts["node-1"].cpu_model == "Test CPU"
    summariser.answered(hosts_full=False)
    clock.advance(1)
    feed(summariser, clock)  # full reports again, the same facts
    assert wire(summariser.summary()).hosts == {}
    summariser.answered(hosts_full=False)
    clock.advance(1)
    feed(summariser, clock, cpu_model="Other CPU")
    changed = wire(summariser.summary())
    # Not accepted (the post failed): the next summary sends the change again.
    again = wire(summariser.summary())
    assert sorted(changed.hosts) == sorted(again.hosts) == ["node-0", "node-1", "node-2"]
    assert again.hosts["node-0"].cpu_model == "Other CPU" and not again.hosts_full
    summariser.answered(hosts_full=True)  # the owner restarted: it wants every host's facts
    everything = wire(summariser.summary())
    assert (sorted(everything.hosts), everything.hosts_full) == (["node-0", "node-1", "node-2"], True)


def test_a_summary_is_sent_while_the_owner_holds_a_job_of_the_relays_and_not_before(
        summariser: Summariser, clock: FakeClock) -> None:
    assert summariser.summary() is None
    feed(summariser, clock)
    assert wire(summariser.summary()).jobs
    summariser.answered(hosts_full=False)
    clock.advance(3600)  # the job forgotten: the owner must hear it is gone
    empty = wire(summariser.summary())
    assert (empty.jobs, empty.nodes) == ([], [])
    summariser.answered(hosts_full=False)
    assert summariser.summary() is None


@pytest.mark.parametrize("owner, local, merged", [
    # The relay needs a full report the owner does not ask for: the agent is asked.
    ({"accepted": True, "ranks": 1, "send_full": False}, {"ranks": 5, "send_full": True, "full_in_s": 2.0},
     {"accepted": True, "ranks": 5, "send_full": True, "full_in_s": 2.0}),
    # The owner asks: its timing stands.
    ({"accepted": True, "ranks": 1, "send_full": True, "full_in_s": 0.5}, {"ranks": 5, "send_full": True,
                                                                           "full_in_s": 2.0},
     {"accepted": True, "ranks": 5, "send_full": True, "full_in_s": 0.5}),
    ({"accepted": True, "ranks": 1, "send_full": False, "orders": [1]}, {"ranks": 5, "send_full": False},
     {"accepted": True, "ranks": 5, "send_full": False, "orders": [1]}),
    # A refusal by the owner is the agent's answer as it is.
    ({"accepted": False, "detail": "no"}, {"ranks": 5, "send_full": True, "full_in_s": 2.0},
     {"accepted": False, "detail": "no"}),
])
def test_the_agent_gets_the_owners_answer_with_what_the_relay_asks(owner: dict, local: dict, merged: dict) -> None:
    assert merge_answer(owner, local) == merged


@pytest.mark.live
def test_a_summarising_relay_answers_its_agents_and_the_monitor_sees_every_rank(tmp_path: Path) -> None:
    async def post_all(base: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
            return list(await asyncio.gather(*(client.post("/api/v1/reports", json=b) for b in bodies)))

    def nodes_reports() -> list[dict[str, Any]]:
        now = time.time()
        bodies = [report(node=f"node-{n}", ranks=giant_ranks(now, n), sent_at=now) for n in range(NODES)]
        bodies[0]["ranks"].append(rank(job_id="small", rank=0, world_size=2))
        return bodies

    with running_monitor(tmp_path) as monitor, running_relay(
            tmp_path, monitor.base, "--summarise", "--summarise-ranks", "8", "--summary-interval", "0.2",
            "--name", "relay-live") as relay:
        answers = asyncio.run(post_all(relay.base, nodes_reports()))
        assert [a.status_code for a in answers] == [202] * NODES, [a.text for a in answers]
        assert all(a.json()["accepted"] for a in answers)
        rounds = 1
        assert [a.json()["ranks"] for a in answers] == [PER_NODE + 1] + [PER_NODE] * (NODES - 1)
        deadline = time.monotonic() + 20
        jobs: dict[str, Any] = {}
        while time.monotonic() < deadline:
            found = httpx.get(monitor.base + "/diagnose", params={"format": "json"}, timeout=10).json()["jobs"]
            jobs = {j["job_id"]: j for j in found}
            if jobs.get(GIANT, {}).get("ranks_total") == WORLD:
                break
            # Agents report every second: the owner's picture of the giant job comes from summaries only.
            asyncio.run(post_all(relay.base, nodes_reports()))
            rounds += 1
            time.sleep(0.2)
        assert jobs.get(GIANT, {}).get("ranks_total") == WORLD, jobs
        # The small job's rank was forwarded as a report.
        assert jobs["small"]["ranks_total"] == 1
        assert metric(relay.base, "hangwatch_relay_summaries_total", outcome="sent") >= 1
        assert metric(relay.base, "hangwatch_relay_summary_bytes") > 0
        # Only node-0's report (the small job's rank) went on to the monitor each round; the rest stayed here.
        assert metric(relay.base, "hangwatch_relay_reports_total", outcome="answered") == rounds
        assert "Traceback" not in relay.log_text() and "Traceback" not in monitor.log_text()


@pytest.mark.parametrize("asked, expected", [
    ({GIANT: [3, 5]}, {GIANT: frozenset({3, 5})}),
    ({GIANT: [3], "another-job": [1]}, {GIANT: frozenset({3})}),  # a job the summary did not hold
    ({GIANT: [-1, "7", 2.0, True, None, 4]}, {GIANT: frozenset({4})}),  # only ranks
    ({GIANT: list(range(1000))}, {GIANT: frozenset(range(64))}),  # at most DETAIL_RANKS_MAX
    ({GIANT: 3}, {}), ([GIANT], {}), ("detail", {}), (None, {}), ({GIANT: []}, {}),
])
def test_the_owners_request_for_detail_is_read_with_care(asked: object, expected: dict) -> None:
    assert detail_request(asked, {GIANT}) == expected


def test_the_ranks_the_owners_answer_names_come_whole_from_the_relay(
        summariser: Summariser, clock: FakeClock, client: TestClient) -> None:
    """Every rank parked in the same all_reduce, one of them stopped stepping first: the culprit is a
    member of the one big group, so the owner asks for it and the relay sends it whole, its sockets
    and progress history with it."""
    first, steps_stopped = 6, clock.now + 5

    def feed_progress() -> None:
        for node in range(NODES):
            ranks = []
            for r in range(node * PER_NODE, node * PER_NODE + PER_NODE):
                last = min(clock.now, steps_stopped - (3 if r == first else 0))
                recent = [(last - 2 * k, 100 - k) for k in (2, 1, 0)]
                ranks.append(rank(job_id=GIANT, rank=r, world_size=WORLD, pid=10_000 + r, cpu_percent=0.5,
                                  stack=stack(clock.now - 0.5), progress=progress(events=100, step=100, recent=recent),
                                  sockets=[socket(f"10.0.0.{node + 2}:{41_000 + r}", GIANT)]))
            taken = summariser.take(decoded(report(node=f"node-{node}", ranks=ranks, sent_at=clock.now)), False)
            assert taken.answer is not None and taken.answer["accepted"], taken

    def summarise() -> tuple[Summary, dict[str, Any]]:
        summary = wire(summariser.summary())
        answer = client.post("/api/v1/summaries", content=encode_summary(summary),
                             headers={"content-type": "application/json"})
        assert answer.status_code == 202, answer.text
        return summary, answer.json()

    clock.advance(6)
    feed_progress()
    summary, answer = summarise()
    assert [v.rank for v in summary.jobs[0].ranks] == [] and "detail" not in answer  # no culprit yet: one group
    summariser.answered(answer["hosts_full"], answer.get("detail"))
    clock.advance(12)  # parked past the pace of their steps
    feed_progress()
    summary, answer = summarise()
    [job] = client.get("/diagnose", params={"format": "json", "job": GIANT}).json()["jobs"]
    assert (job["verdict"], job["culprit_ranks"]) == ("deadlock", [first]), job["summary"]
    # The culprit was a member of the group: no sockets of its own at the owner until it comes whole.
    assert [v.rank for v in summary.jobs[0].ranks] == []
    summary, answer = summarise()  # the owner's answer names it now
    assert answer["detail"] == {GIANT: [first]}
    summariser.answered(answer["hosts_full"], answer["detail"])
    summary, _ = summarise()
    [culprit] = summary.jobs[0].ranks
    assert culprit.rank == first and [s.local for s in culprit.sockets] == [f"10.0.0.3:{41_000 + first}"]
    assert len(culprit.progress_times) == 3
    assert first not in {m.rank for g in summary.jobs[0].groups for m in g.members}
    [result] = monitor_of(client).results(job_id=GIANT)
    assert [s.local for s in next(v for v in result.view.ranks if v.rank == first).sockets] == [
        f"10.0.0.3:{41_000 + first}"]
    assert result.diagnosis.culprit_ranks == (first,)


def test_a_relay_forgets_nodes_and_jobs_silent_past_the_retention_as_a_monitor_does(
        summariser: Summariser, clock: FakeClock) -> None:
    clock.advance(1)
    feed(summariser, clock)
    assert wire(summariser.summary()).jobs
    engine = summariser.monitor
    assert engine._snapshot_due.keys() == {f"node-{n}" for n in range(NODES)}
    clock.advance(max(engine.settings.job_retention_s, SILENT_NODE_KEPT_S) + 60)
    summary = summariser.summary()
    assert summary is None or not summary.jobs
    # A relay runs no passes: what a pass forgets is forgotten before each summary instead, or every
    # node ever heard would stay in the engine's per-node maps.
    assert not engine._snapshot_due and not engine._full_seen and not engine._state.nodes
