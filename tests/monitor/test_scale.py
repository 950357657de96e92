"""64 ranks over 8 nodes: ingest and diagnosis stay well within a report interval."""

from __future__ import annotations

import json
import time
from pathlib import Path

from monitor_reports import progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient, monitor_of

from monitor.web.app import create_app
from monitor.diagnosis import VERDICTS
from monitor.web.settings import Settings
from monitor.storage.store import Store


def test_sixty_four_ranks(client: TestClient, clock: FakeClock) -> None:
    started = time.perf_counter()
    for second in range(10):
        for node in range(8):
            recent = [(clock.now - j, second * 10 - j) for j in range(5, 0, -1)]
            ranks = [
                rank(job_id="big", rank=node * 8 + i, world_size=64, stack=stack(clock.now),
                     progress=progress(second + 1, second * 10, recent))
                for i in range(8)
            ]
            assert client.post("/api/v1/reports", json=report(node=f"node-{node}", ranks=ranks,
                                                               sent_at=clock.now)).status_code == 202
        clock.advance(1)
    ingest_s = time.perf_counter() - started

    started = time.perf_counter()
    for _ in range(10):
        monitor_of(client).tick()
    tick_s = (time.perf_counter() - started) / 10
    [job] = client.get("/diagnose", params={"format": "json"}).json()["jobs"]
    assert len(job["ranks"]) == 64
    # Generous bounds (shared CI machines); measured ~2 ms per report and ~4 ms per tick.
    assert ingest_s / 80 < 0.1
    assert tick_s < 0.25


def test_background_tick_records_verdicts(tmp_path: Path) -> None:
    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 0.05})
    store = Store(settings.db)
    try:
        with TestClient(create_app(settings, store)) as client:
            client.post("/api/v1/reports", content=json.dumps(report()), headers={"content-type": "application/json"})
            deadline = time.monotonic() + 5
            history: list = []
            while time.monotonic() < deadline and not history:
                time.sleep(0.05)
                history = store.verdict_history("job-a")
            assert len(history) == 1 and history[0].verdict in VERDICTS
    finally:
        store.close()
