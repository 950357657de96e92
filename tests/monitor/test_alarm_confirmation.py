"""The monitor publishes an alarm only once its raw verdicts last (settings.confirm_alarms,
on by default): /diagnose, the history and the metrics all see the settled verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from monitor_reports import rank, report
from monitor_testkit import FakeClock, TestClient
from test_api_diagnose import StubDiagnosis

from monitor.web.app import create_app
from monitor.web.settings import Settings
from monitor.storage.store import open_store


@pytest.fixture
def confirming(tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, StubDiagnosis]]:
    stub = StubDiagnosis()
    monkeypatch.setattr("monitor.diagnosis.diagnose", stub)
    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 0})
    assert settings.confirm_alarms
    store = open_store(settings, clock)
    with TestClient(create_app(settings, store, clock=clock)) as client:
        yield client, stub
    store.close()


def verdict(client: TestClient) -> dict:
    [job] = client.get("/diagnose", params={"format": "json"}).json()["jobs"]
    return job


def history(client: TestClient) -> list[str]:
    return [h["verdict"] for h in client.get("/api/v1/jobs/job-a/history").json()["history"]]


def test_a_lasting_deadlock_is_published_on_the_second_reading(confirming, clock: FakeClock) -> None:
    client, stub = confirming
    assert client.post("/api/v1/reports", json=report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now)).status_code == 202
    stub.verdict, stub.culprits = "healthy", ()
    assert verdict(client)["verdict"] == "healthy"
    stub.verdict, stub.culprits = "deadlock", (1,)
    clock.advance(1)
    first = verdict(client)
    assert (first["verdict"], first["culprit_ranks"]) == ("healthy", [])
    assert "possible deadlock" in first["summary"]
    clock.advance(1)
    second = verdict(client)
    assert (second["verdict"], second["culprit_ranks"]) == ("deadlock", [1])
    assert history(client) == ["healthy", "deadlock"]
    metrics = client.get("/metrics").text
    assert 'hangwatch_job_verdict{job_id="job-a",verdict="deadlock"} 1.0' in metrics


def test_a_one_reading_flap_leaves_no_trace(confirming, clock: FakeClock) -> None:
    client, stub = confirming
    assert client.post("/api/v1/reports", json=report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now)).status_code == 202
    for v in ("healthy", "deadlock", "healthy", "stalled", "healthy", "healthy"):
        stub.verdict, stub.culprits = v, ((1,) if v == "deadlock" else ())
        assert verdict(client)["verdict"] == "healthy"
        clock.advance(1)
    assert history(client) == ["healthy"]


def test_a_raised_alarm_stays_raised_across_a_restart(tmp_path: Path, clock: FakeClock,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    stub = StubDiagnosis()
    monkeypatch.setattr("monitor.diagnosis.diagnose", stub)
    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 0})
    for restart in range(2):
        store = open_store(settings, clock)
        with TestClient(create_app(settings, store, clock=clock)) as client:
            if restart == 0:
                body = report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now)
                assert client.post("/api/v1/reports", json=body).status_code == 202
                verdict(client)
                clock.advance(1)
                assert verdict(client)["verdict"] == "deadlock"
            else:
                # The first reading after the restart: still the deadlock, no "healthy" recorded between.
                assert verdict(client)["verdict"] == "deadlock"
                assert history(client) == ["healthy", "deadlock"]
        store.close()
        clock.advance(1)
