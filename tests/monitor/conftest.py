from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import warnings

import pytest
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 under its TestClient; until the project's test extras
    # bring it, httpx serves the same. Only this one warning is let through.
    warnings.filterwarnings(
        "ignore", message="Using `httpx` with `starlette.testclient`", category=StarletteDeprecationWarning
    )
    from fastapi.testclient import TestClient

from monitor.app import create_app
from monitor.settings import Settings
from monitor.store import Store


class FakeClock:
    """The monitor's clock, moved by hand so ages and offsets are exact."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "monitor.db"


@pytest.fixture
def settings(db_path: Path) -> Settings:
    # No background tick: tests decide when verdicts are recorded.
    return Settings.from_raw({"db": db_path, "tick_interval_s": 0, "max_body_bytes": 64 * 1024})


@pytest.fixture
def store(settings: Settings, clock: FakeClock) -> Iterator[Store]:
    store = Store(settings.db, settings.report_retention_s, settings.reports_per_node, clock=clock)
    yield store
    store.close()


@pytest.fixture
def client(settings: Settings, store: Store, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings, store, clock=clock)) as client:
        yield client


def monitor_of(client: TestClient):  # noqa: ANN201
    return client.app.state.monitor  # type: ignore[attr-defined]
