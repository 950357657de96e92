"""Helpers for the monitor's tests: a hand-moved clock and the TestClient import."""

from __future__ import annotations

import warnings

from fastapi import FastAPI
from starlette.exceptions import StarletteDeprecationWarning

from monitor.service import Monitor

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 under its TestClient; until the project's test extras
    # bring it, httpx serves the same. Only this one warning is let through.
    warnings.filterwarnings(
        "ignore", message="Using `httpx` with `starlette.testclient`", category=StarletteDeprecationWarning
    )
    from fastapi.testclient import TestClient

__all__ = ["FakeClock", "TestClient", "monitor_of"]


class FakeClock:
    """The monitor's clock, moved by hand so ages and offsets are exact."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def monitor_of(client: TestClient) -> Monitor:
    app = client.app
    assert isinstance(app, FastAPI)
    return app.state.monitor
