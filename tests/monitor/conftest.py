from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from monitor_testkit import FakeClock, TestClient

from monitor.web.app import create_app
from monitor.web.settings import Settings
from monitor.storage.store import Store, open_store


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "monitor.db"


@pytest.fixture
def settings(db_path: Path) -> Settings:
    # No background tick: tests decide when verdicts are recorded.
    # One reading per test: alarms are published as read (their confirmation has tests of its own).
    # Shedding only past 4 s of loop lag: a loaded test machine lags too, and a shed report is a 503 the
    # test did not ask for (the shedding tests note a lag of 5 s themselves).
    return Settings.from_raw({"db": db_path, "tick_interval_s": 0, "max_body_bytes": 64 * 1024,
                              "confirm_alarms": False, "shed_lag_s": 4.0})


@pytest.fixture
def store(settings: Settings, clock: FakeClock) -> Iterator[Store]:
    store = open_store(settings, clock)
    yield store
    store.close()


@pytest.fixture
def client(settings: Settings, store: Store, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings, store, clock=clock)) as client:
        yield client
