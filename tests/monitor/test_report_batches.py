"""POST /api/v1/report-batches: a relay's batch, each report taken or refused as if posted alone."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from monitor_testkit import FakeClock, TestClient, monitor_of
from monitor_reports import rank, report

from monitor.web.app import create_app
from monitor.ingest.fastwire import decode_report, encode_report
from monitor.relay.forwarder import batch_body
from monitor.web.routes.ingest import batch_body_limit
from monitor.web.settings import Settings
from monitor.storage.store import Store

BATCHES = "/api/v1/report-batches"
AGENTS = "agents-token-0123456789abcdef"
NODE_A = "node-a-token-0123456789abcdef"
RELAY = "relay-token-0123456789abcdef"


def batch(*entries: tuple[dict, bool]) -> bytes:
    """What a relay sends: each report decoded and encoded again (monitor/relay/app.py)."""
    return batch_body([(encode_report(decode_report(json.dumps(body).encode())), attributed)
                       for body, attributed in entries])


def post(client: TestClient, body: bytes, token: str | None = None):  # type: ignore[no-untyped-def]
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return client.post(BATCHES, content=body, headers=headers)


def test_each_report_of_a_batch_is_answered_in_order_as_if_posted_alone(client: TestClient, clock: FakeClock) -> None:
    taken = report(node="node-a", ranks=[rank(rank=0)], sent_at=clock.now)
    # A job larger than this monitor takes (max_world_size): refused on its own, the rest still taken.
    too_large = report(node="node-b", ranks=[rank(job_id="job-b", world_size=70_000)], sent_at=clock.now)
    also_taken = report(node="node-c", ranks=[rank(rank=1)], sent_at=clock.now, delta=True)
    response = post(client, batch((taken, False), (too_large, False), (also_taken, False)))
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 422, 202], results
    assert results[0]["body"] == {"accepted": True, "ranks": 1, "delta": True, "send_full": False, "replay": True}
    assert results[1]["body"]["accepted"] is False and "world" in results[1]["body"]["detail"], results[1]
    # A delta from a node this monitor has no full picture of: asked for a full report, as a direct post is.
    assert results[2]["body"]["send_full"] is True
    monitor = monitor_of(client)
    assert monitor.reports_total == 2
    assert sorted(monitor.node_ids()) == ["node-a", "node-c"]


@pytest.mark.parametrize("body", [
    b'{"reports": [',
    b'{"reports": [{"report": {"node": "n"}}]}',
    b'[{"schema_version": 1}]',
])
def test_what_is_not_a_batch_is_refused_whole_and_changes_nothing(client: TestClient, body: bytes) -> None:
    response = post(client, body)
    assert response.status_code == 422
    assert response.json()["detail"].startswith("not a batch of reports")
    monitor = monitor_of(client)
    assert monitor.reports_total == 0 and dict(monitor.figures().rejected)["schema"] == 1


@pytest.fixture
def guarded(settings: Settings, store: Store, clock: FakeClock, tmp_path: Path) -> Iterator[TestClient]:
    """A monitor with agents' tokens (one bound to node-a) and a relay's token."""
    agents, relay = tmp_path / "agents.tokens", tmp_path / "relay.tokens"
    agents.write_text(f"{AGENTS}\nnode-a {NODE_A}\n")
    relay.write_text(f"{RELAY}\n")
    for path in (agents, relay):
        path.chmod(0o600)
    guarded = dataclasses.replace(settings, token_file=agents, relay_token_file=relay)
    with TestClient(create_app(guarded, store, clock=clock)) as client:
        yield client


@pytest.mark.parametrize(("token", "status", "believed"), [
    (RELAY, 200, True),      # a relay's token: its node checks are believed
    (AGENTS, 401, None),     # with a relay file, agents' tokens post reports, never batches
    (NODE_A, 401, None),
    (None, 401, None),
    ("not-a-token-0123456789abcdef", 401, None),
])
def test_with_a_relay_file_only_a_relay_token_posts_batches_and_is_believed(guarded: TestClient, clock: FakeClock, token: str | None,
                                                     status: int, believed: bool | None) -> None:
    response = post(guarded, batch((report(node="node-a", sent_at=clock.now), True)), token)
    assert response.status_code == status, response.text
    nodes = monitor_of(guarded)._state.nodes
    if believed is None:
        assert "node-a" not in nodes
    else:
        assert response.json()["results"][0]["status"] == 202
        assert nodes["node-a"].attributed is believed


def test_without_a_relay_token_file_batches_take_an_unbound_agent_token(clock: FakeClock, settings: Settings,
                                                                        store: Store, tmp_path: Path) -> None:
    agents = tmp_path / "agents.tokens"
    agents.write_text(f"{AGENTS}\nnode-a {NODE_A}\n")
    agents.chmod(0o600)
    with TestClient(create_app(dataclasses.replace(settings, token_file=agents), store, clock=clock)) as guarded:
        assert post(guarded, batch((report(sent_at=clock.now), True)), None).status_code == 401
        # A node's token cannot speak for other nodes, even its own report in a batch.
        bound = post(guarded, batch((report(sent_at=clock.now), True)), NODE_A)
        assert bound.status_code == 403 and "bound to one node" in bound.json()["detail"]
        assert "node-a" not in monitor_of(guarded).node_ids()
        response = post(guarded, batch((report(sent_at=clock.now), True)), AGENTS)
        assert response.status_code == 200
        assert monitor_of(guarded)._state.nodes["node-a"].attributed is False


@pytest.mark.parametrize("limit", [4096, 1024 * 1024])
def test_a_report_past_the_per_report_limit_is_refused_alone_in_a_batch(clock: FakeClock, settings: Settings,
                                                                        store: Store, limit: int) -> None:
    """However small the limit, a batch carries no report a direct post could not."""
    limited = dataclasses.replace(settings, max_body_bytes=limit)
    small = report(node="node-a", sent_at=clock.now)
    # Past the limit by its ranks alone (each ~4 KiB with a long command line, every field valid).
    count = limit // 4096 + 2
    big = report(node="node-b", sent_at=clock.now,
                 ranks=[rank(job_id="job-b", rank=i, world_size=count, cmdline="x" * 4000) for i in range(count)])
    with TestClient(create_app(limited, store, clock=clock)) as client:
        response = post(client, batch((small, False), (big, False)))
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["status"] for r in results] == [202, 413], results
        assert f"limit of {limit} bytes" in results[1]["body"]["detail"]
        monitor = monitor_of(client)
        assert sorted(monitor.node_ids()) == ["node-a"] and dict(monitor.figures().rejected)["too_large"] == 1


def test_a_batch_is_no_way_around_the_per_report_size_limit(clock: FakeClock, settings: Settings, store: Store) -> None:
    """A batch may be as large as one report plus the batch's framing, and no larger."""
    limited = dataclasses.replace(settings, max_body_bytes=1024 * 1024)
    limit = batch_body_limit(limited.max_body_bytes)
    assert limit < 1.5 * limited.max_body_bytes

    def padded_to(size: int) -> bytes:  # one small report, padded with whitespace the decoder skips
        body = batch((report(sent_at=clock.now), False))
        return body[:-1] + b" " * (size - len(body)) + body[-1:]

    with TestClient(create_app(limited, store, clock=clock)) as client:
        assert post(client, padded_to(limit)).status_code == 200
        response = post(client, padded_to(limit + 1))
        assert response.status_code == 413, response.text
        assert dict(monitor_of(client).figures().rejected)["too_large"] == 1
        assert monitor_of(client).reports_total == 1
