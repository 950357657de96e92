"""The real hangwatch-monitor on uvicorn in a subprocess, on loopback, for tests that need the daemon;
and what its /metrics says."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.demo.harness import free_port

EXE = shutil.which("hangwatch-monitor") or str(Path(sys.executable).parent / "hangwatch-monitor")


@dataclass
class RunningMonitor:
    proc: subprocess.Popen[str]
    base: str
    db: Path
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until_up(proc: subprocess.Popen[str], base: str, timeout: float = 45.0, log: Path | None = None,
                  **client_options: object) -> None:
    # A generous deadline: at the suite's start six workers import and start at once on two cores
    # (a clean-clone run once took over 20 s to answer /healthz).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = log.read_text(errors="replace") if log else (proc.stderr.read() if proc.stderr else "")
            raise AssertionError(f"monitor exited early with {proc.returncode}: {said}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1.0, **client_options).status_code == 200:  # type: ignore[arg-type]
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("monitor did not come up")


def _open_file_limit(count: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))
    return apply


@contextlib.contextmanager
def running_monitor(tmp_path: Path, *args: str, db: Path | None = None, scheme: str = "http",
                    open_file_limit: int | None = None, client_options: dict | None = None,
                    extra_env: dict[str, str] | None = None, port: int | None = None) -> Iterator[RunningMonitor]:
    """Start the monitor with ``args`` added; stop it (SIGKILL if need be) however the test ends."""
    port = port or free_port()
    db = db or tmp_path / "state" / "monitor.db"
    log = tmp_path / f"monitor-{port}.log"
    # No shedding unless a test asks (``extra_env``): beside the suite's other workers the monitor's loop
    # lags past the default 0.5 s, and a node's second report within seconds was a 503 no test asked for.
    env = {**os.environ, "HANGWATCH_STATE_DIR": str(tmp_path / "unused"), "HANGWATCH_SHED_LAG_S": "3600",
           **(extra_env or {})}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [EXE, "--host", "127.0.0.1", "--port", str(port), "--db", str(db), "--log-level", "warning", *args],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
            preexec_fn=_open_file_limit(open_file_limit) if open_file_limit else None,
        )
    try:
        base = f"{scheme}://127.0.0.1:{port}"
        wait_until_up(proc, base, log=log, **(client_options or {}))
        yield RunningMonitor(proc, base, db, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


RELAY_EXE = shutil.which("hangwatch-relay") or str(Path(sys.executable).parent / "hangwatch-relay")


@contextlib.contextmanager
def running_relay(tmp_path: Path, monitor: str, *args: str, port: int | None = None,
                  extra_env: dict[str, str] | None = None) -> Iterator[RunningMonitor]:
    """``hangwatch-relay`` in front of the monitor at ``monitor``; stopped however the test ends."""
    port = port or free_port()
    log = tmp_path / f"relay-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([RELAY_EXE, "--monitor", monitor, "--host", "127.0.0.1", "--port", str(port),
                                 "--log-level", "warning", *args], stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**{k: v for k, v in os.environ.items() if not k.startswith("HANGWATCH_")},
                                     **(extra_env or {})})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(proc, base, log=log)
        yield RunningMonitor(proc, base, tmp_path, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def metric(base: str, name: str, headers: dict[str, str] | None = None, **labels: str) -> float:
    """The sample ``name`` whose labels include ``labels`` in the /metrics of the monitor (or relay)
    at ``base``, read with Prometheus' own parser; an AssertionError when the scrape fails or has none."""
    scrape = httpx.get(f"{base}/metrics", headers=headers or {}, timeout=5)
    assert scrape.status_code == 200, f"/metrics answered {scrape.status_code}: {scrape.text[:200]}"
    for family in text_string_to_metric_families(scrape.text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"{name} {labels} not in /metrics")
