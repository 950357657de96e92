"""The real thing: hangwatch-monitor on uvicorn in a subprocess, on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import EXE, wait_until_up

from tests.notify_socket import NotifySocket
from hangwatch.demo.harness import free_port

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    port = free_port()
    db = tmp_path / "state" / "monitor.db"
    env = {**os.environ, "HANGWATCH_STATE_DIR": str(tmp_path / "unused")}
    proc = subprocess.Popen(
        [EXE, "--host", "127.0.0.1", "--port", str(port), "--db", str(db), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(proc, base)
        yield proc, base, db
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_real_server_ingests_diagnoses_and_stops_on_sigterm(server: tuple[subprocess.Popen[str], str, Path]) -> None:
    proc, base, db = server
    body = report(ranks=[rank(job_id="real-job", rank=0), rank(job_id="real-job", rank=1)])
    response = httpx.post(f"{base}/api/v1/reports", json=body, timeout=5.0)
    assert response.status_code == 202
    assert response.json() == {"accepted": True, "ranks": 2, "delta": True, "send_full": False, "replay": True}

    text = httpx.get(f"{base}/diagnose", timeout=5.0).text
    assert "real-job" in text
    data = httpx.get(f"{base}/diagnose", params={"format": "json"}, timeout=5.0).json()
    assert [j["job_id"] for j in data["jobs"]] == ["real-job"]
    metrics = httpx.get(f"{base}/metrics", timeout=5.0)
    assert metrics.status_code == 200 and 'hangwatch_job_verdict{job_id="real-job"' in metrics.text
    assert httpx.get(f"{base}/", timeout=5.0).headers["content-type"].startswith("text/html")

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
    assert db.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--port", "notaport"], "port"),
        (["--port", "99999"], "port must be between 1 and 65535"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    result = subprocess.run(
        [EXE, "--db", str(tmp_path / "m.db"), *args], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0] and lines[0].startswith("hangwatch-monitor: error:")


def test_db_dir_that_cannot_be_created_exits_2(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = subprocess.run(
        [EXE, "--db", str(not_a_dir / "sub" / "m.db"), "--port", str(free_port())],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot create database directory" in result.stderr


def test_real_server_tells_systemd_it_is_ready_and_alive(tmp_path: Path) -> None:
    """Under a Type=notify unit: READY=1 once serving, WATCHDOG=1 while the event loop runs."""
    notify = NotifySocket(tmp_path / "notify.sock")
    port = free_port()
    proc = subprocess.Popen([EXE, "--port", str(port), "--db", str(tmp_path / "m.db")],
                            env={**os.environ, **notify.env(1_000_000)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        messages = notify.wait_until(lambda ms: any("WATCHDOG=1" in m for m in ms) and any("READY=1" in m for m in ms))
        ready = next(m for m in messages if "READY=1" in m)
        assert f"MAINPID={proc.pid}" in ready
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5.0).status_code == 200
        proc.send_signal(signal.SIGTERM)
        notify.wait_until(lambda ms: any("STOPPING=1" in m for m in ms))
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        notify.close()
