"""POST /api/v1/reports: accepted reports land in state and the store; rejected ones change nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from monitor_testkit import FakeClock, TestClient, monitor_of
from monitor_reports import rank, report

from monitor.storage.store import Store

URL = "/api/v1/reports"


def jobs(client: TestClient) -> list[dict]:
    return client.get("/diagnose", params={"format": "json"}).json()["jobs"]


def test_accepts_a_valid_report(client: TestClient, clock: FakeClock, store: Store) -> None:
    body = report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now)
    response = client.post(URL, json=body)
    assert response.status_code == 202
    assert response.json() == {"accepted": True, "ranks": 2, "delta": True, "send_full": False, "replay": True}
    [job] = jobs(client)
    assert job["job_id"] == "job-a"
    assert [r["rank"] for r in job["ranks"]] == [0, 1]
    assert store.count_snapshots() == 1
    assert monitor_of(client).reports_total == 1


def assert_unchanged(client: TestClient, store: Store) -> None:
    assert jobs(client) == []
    assert store.count_snapshots() == 0
    assert monitor_of(client).reports_total == 0


@pytest.mark.parametrize(
    ("content", "reason", "needle"),
    [
        (b'{"schema_version": 1, "node": ', "invalid_json", "not valid JSON"),
        (b"", "invalid_json", "not valid JSON"),
        (json.dumps({"node": "n", "sent_at": 1.0}).encode(), "schema", "schema_version"),
        (json.dumps(report(ranks=[rank(pid=0)])).encode(), "schema", "ranks.0.pid"),
        (json.dumps(report(node="bad node!")).encode(), "schema", "node"),
        (json.dumps(report(ranks=[rank(log_phase={"phase": "lunch", "seen_at": 1.0})])).encode(), "schema",
         "ranks.0.log_phase.phase"),
        (json.dumps(report(schema_version=2)).encode(), "schema", "schema_version"),
        (json.dumps([1, 2]).encode(), "schema", "(body)"),
    ],
    # Named, not the bodies: they hold the time they were made, and parallel workers must collect
    # the same test ids.
    ids=["truncated", "empty", "no schema_version", "pid 0", "bad node name", "unknown phase", "schema_version 2",
         "a list"],
)
def test_rejects_malformed_reports_with_422_naming_the_problem(
    client: TestClient, store: Store, content: bytes, reason: str, needle: str
) -> None:
    response = client.post(URL, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["accepted"] is False
    assert needle in response.json()["detail"]
    assert dict(monitor_of(client).figures().rejected)[reason] == 1
    assert_unchanged(client, store)


def test_one_bad_rank_rejects_the_whole_report(client: TestClient, store: Store, clock: FakeClock) -> None:
    body = report(ranks=[rank(rank=0), rank(rank=1, world_size=0)], sent_at=clock.now)
    response = client.post(URL, json=body)
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "ranks.1.world_size", "message": "Input should be greater than or equal to 1"}
    ]
    assert_unchanged(client, store)


def test_rejects_a_wrong_content_type_with_415(client: TestClient, store: Store) -> None:
    response = client.post(URL, content=json.dumps(report()), headers={"content-type": "text/plain"})
    assert response.status_code == 415
    assert dict(monitor_of(client).figures().rejected)["content_type"] == 1
    assert_unchanged(client, store)


def test_accepts_a_charset_parameter(client: TestClient, clock: FakeClock) -> None:
    response = client.post(
        URL, content=json.dumps(report(sent_at=clock.now)), headers={"content-type": "application/json; charset=utf-8"}
    )
    assert response.status_code == 202


def oversized_report() -> bytes:
    # Valid JSON, well over the 64 KiB limit the test settings use.
    return json.dumps(report(ranks=[rank(cmdline="x" * 4000, rank=i) for i in range(40)])).encode()


def test_rejects_an_oversized_body_by_content_length_with_413(client: TestClient, store: Store) -> None:
    response = client.post(URL, content=oversized_report(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert dict(monitor_of(client).figures().rejected)["too_large"] == 1
    assert_unchanged(client, store)


def test_rejects_an_oversized_streamed_body_with_413(client: TestClient, store: Store) -> None:
    body = oversized_report()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 8192):
            yield body[i : i + 8192]

    # A generator body goes out chunked, without Content-Length: only counting catches it.
    response = client.post(URL, content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert_unchanged(client, store)


def test_a_streamed_body_within_the_limit_is_accepted(client: TestClient, clock: FakeClock) -> None:
    body = json.dumps(report(sent_at=clock.now)).encode()
    response = client.post(URL, content=iter([body[:10], body[10:]]), headers={"content-type": "application/json"})
    assert response.status_code == 202
