"""How each rank was found (the agent's ``launcher`` and ``identified_by``), in /diagnose."""

from __future__ import annotations

from monitor_reports import rank, report
from monitor_testkit import FakeClock, TestClient

URL = "/api/v1/reports"


def test_diagnose_says_how_the_ranks_were_found(client: TestClient, clock: FakeClock) -> None:
    ranks = [
        rank(job_id="127.0.0.1:48007", rank=0, launcher="lightning",
             identified_by="lightning:parent-of-LOCAL_RANK-children"),
        rank(job_id="127.0.0.1:48007", rank=1, launcher="lightning", identified_by="lightning:LOCAL_RANK"),
    ]
    assert client.post(URL, json=report(ranks=ranks, sent_at=clock.now)).status_code == 202
    [job] = client.get("/diagnose", params={"format": "json"}).json()["jobs"]
    assert [(r["launcher"], r["identified_by"]) for r in job["ranks"]] == [
        ("lightning", "lightning:parent-of-LOCAL_RANK-children"), ("lightning", "lightning:LOCAL_RANK")]
    text = client.get("/diagnose").text
    assert "ranks found by lightning:parent-of-LOCAL_RANK-children (rank 0), lightning:LOCAL_RANK (rank 1)" in text


def test_reports_of_agents_without_identified_by_still_validate(client: TestClient, clock: FakeClock) -> None:
    assert client.post(URL, json=report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now)).status_code == 202
    [job] = client.get("/diagnose", params={"format": "json"}).json()["jobs"]
    assert {r["identified_by"] for r in job["ranks"]} == {""}
    assert "ranks found by" not in client.get("/diagnose").text
