"""Helpers for the monitor's tests: a hand-moved clock and the TestClient import."""

from __future__ import annotations

import warnings

from fastapi import FastAPI
from starlette.exceptions import StarletteDeprecationWarning

import msgspec
import pydantic
import pytest

from monitor.ingest.fastwire import _decoder, decode_report
from monitor.engine.service import Monitor

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 under its TestClient; until the project's test extras
    # bring it, httpx serves the same. Only this one warning is let through.
    warnings.filterwarnings(
        "ignore", message="Using `httpx` with `starlette.testclient`", category=StarletteDeprecationWarning
    )
    from fastapi.testclient import TestClient

__all__ = ["FakeClock", "TestClient", "assert_refused", "job_answer", "monitor_of", "post_report"]


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


def post_report(client: TestClient, body: dict) -> dict:
    """POST one report; it must be accepted. Returns the monitor's answer."""
    response = client.post("/api/v1/reports", json=body)
    assert response.status_code == 202, response.text
    return response.json()


def job_answer(client: TestClient, job_id: str) -> dict:
    """The job's entry in ``/diagnose?format=json``."""
    response = client.get("/diagnose", params={"format": "json"})
    assert response.status_code == 200
    return next(j for j in response.json()["jobs"] if j["job_id"] == job_id)


def assert_refused(client: TestClient, raw: bytes, field: str) -> None:
    """Both decoders refuse the body naming ``field`` (dotted), and the route answers 422."""
    with pytest.raises(msgspec.DecodeError):  # ValidationError is one
        _decoder.decode(raw)
    with pytest.raises(pydantic.ValidationError) as caught:
        decode_report(raw)
    assert field in {".".join(str(p) for p in e["loc"]) for e in caught.value.errors()}
    assert client.post("/api/v1/reports", content=raw, headers={"content-type": "application/json"}).status_code == 422

