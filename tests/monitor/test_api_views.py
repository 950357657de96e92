"""/diagnose for a cluster: the summary view, problem jobs only, paging, and the monitor's own state."""

from __future__ import annotations

import time

import pytest
from monitor_reports import rank, report
from monitor_testkit import FakeClock, TestClient

from monitor.diagnosis import Diagnosis, JobView

URL = "/api/v1/reports"


@pytest.fixture
def five_jobs(client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """job-0 .. job-4, the newest report last; job-1 and job-3 deadlocked."""

    def verdict(job: JobView) -> Diagnosis:
        bad = job.job_id in ("job-1", "job-3")
        return Diagnosis("deadlock" if bad else "healthy", (1,) if bad else (), None, f"{job.job_id} summary")

    monkeypatch.setattr("monitor.diagnosis.diagnose", verdict)
    ids = [f"job-{i}" for i in range(5)]
    for i, job in enumerate(ids):
        body = report(node=f"node-{i}", ranks=[rank(job_id=job, rank=0), rank(job_id=job, rank=1)], sent_at=clock.now)
        assert client.post(URL, json=body).status_code == 202
        clock.advance(1)
    return ids


def diagnose(client: TestClient, **params: object) -> dict:
    response = client.get("/diagnose", params={"format": "json", **params})
    assert response.status_code == 200, response.text
    return response.json()


def test_summary_view_has_one_small_object_per_job(client: TestClient, five_jobs: list[str]) -> None:
    data = diagnose(client, view="summary")
    assert [j["job_id"] for j in data["jobs"]] == list(reversed(five_jobs))  # most recently active first
    assert data["total_jobs"] == 5
    job = data["jobs"][1]
    assert job["verdict"] == "deadlock" and job["culprit_ranks"] == [1] and job["summary"] == "job-3 summary"
    assert job["ranks_seen"] == 2 and job["nodes"] == 1
    assert "ranks" not in job and "evidence" not in job


@pytest.mark.parametrize(
    ("params", "expected", "total"),
    [
        ({}, ["job-4", "job-3", "job-2", "job-1", "job-0"], 5),
        ({"problems": "true"}, ["job-3", "job-1"], 2),
        ({"limit": 2}, ["job-4", "job-3"], 5),
        ({"offset": 2, "limit": 2}, ["job-2", "job-1"], 5),
        ({"offset": 1, "problems": "true"}, ["job-1"], 2),
        ({"offset": 9}, [], 5),
        ({"job": "job-2"}, ["job-2"], 1),
    ],
)
def test_filters_and_pages(client: TestClient, five_jobs: list[str], params: dict, expected: list[str],
                           total: int) -> None:
    for view in ("full", "summary"):
        data = diagnose(client, view=view, **params)
        assert [j["job_id"] for j in data["jobs"]] == expected
        assert data["total_jobs"] == total


@pytest.mark.parametrize("params", [{"limit": 0}, {"offset": -1}, {"view": "tiny"}])
def test_bad_paging_is_a_422(client: TestClient, params: dict) -> None:
    assert client.get("/diagnose", params={"format": "json", **params}).status_code == 422


def test_text_summary_is_one_line_per_job(client: TestClient, five_jobs: list[str]) -> None:
    text = client.get("/diagnose", params={"view": "summary", "problems": "true"}).text
    lines = text.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("job-3  DEADLOCK culprits 1  2/2 ranks")


def test_the_answer_says_how_the_monitor_keeps_up(client: TestClient, five_jobs: list[str]) -> None:
    status = diagnose(client)["monitor"]
    assert status["overloaded"] is False and status["reports_shed_last_minute"] == 0
    assert status["jobs"] == 5 and status["nodes"] == 5
    guard = client.app.state.load_guard
    now = time.monotonic()  # the guard's clock
    guard.note_lag(5.0, now)  # the worst lag of the last second, for a second
    guard.accepted("node-0", now)
    assert guard.should_shed("node-0", now + 0.1)
    status = diagnose(client)["monitor"]
    assert status["overloaded"] is True and status["loop_lag_s"] == 5.0
    text = client.get("/diagnose").text
    assert text.startswith("hangwatch: monitor over capacity (event loop 5.00s behind)")


def test_cached_pieces_follow_new_diagnoses(client: TestClient, clock: FakeClock) -> None:
    client.post(URL, json=report(ranks=[rank(rank=0, cpu_percent=10.0)], sent_at=clock.now))
    first = diagnose(client)["jobs"][0]["ranks"][0]["cpu_percent"]
    clock.advance(1)
    client.post(URL, json=report(ranks=[rank(rank=0, cpu_percent=77.0)], sent_at=clock.now))
    assert (first, diagnose(client)["jobs"][0]["ranks"][0]["cpu_percent"]) == (10.0, 77.0)
