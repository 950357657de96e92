"""The daemons' logging (hangwatch_common/logs.py): ``--log-format json`` is one JSON object a line for
every line of the process, uvicorn's error and access lines included; ``text`` is one format for
hangwatch's lines and uvicorn's alike. Also: a real monitor started from a config file alone.
(Spells an unknown HANGWATCH_* name on purpose: tests/monitor/test_env_names.py leaves it out of its scan.)"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from agent.cli import parse_config
from hangwatch.demo.harness import free_port
from hangwatch_common.logs import JsonFormatter, TextFormatter, logging_config
from tests.monitor.real_monitor import EXE, RELAY_EXE, wait_until_up

# TIME LEVEL LOGGER: MESSAGE, the time ISO-8601 in UTC.
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (TRACE|DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S")
AGENT_CMD = [sys.executable, "-m", "agent.cli", "--once", "--no-stacks", "--interval", "0.1"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without its HANGWATCH_* variables (they would win over a file)."""
    return {**{k: v for k, v in os.environ.items() if not k.upper().startswith("HANGWATCH_")}, **extra}


def record(name: str = "hangwatch.monitor", msg: str = "hello %s", args: tuple = ("world",),
           level: int = logging.WARNING, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)


# --- the formats, on records ---

def test_a_json_line_has_the_time_in_utc_the_level_the_logger_and_the_message() -> None:
    entry = json.loads(JsonFormatter().format(record()))
    assert entry.keys() == {"time", "level", "logger", "message"}
    assert (entry["level"], entry["logger"], entry["message"]) == ("warning", "hangwatch.monitor", "hello world")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"]), entry["time"]


def test_a_json_line_carries_the_exception_and_stays_one_ascii_line() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        line = JsonFormatter().format(record(msg="client said %r\x1b[2J\u2028", args=("é\n",), exc_info=sys.exc_info()))
    assert "\n" not in line and line.isascii()
    entry = json.loads(line)
    assert entry["exception"].startswith("Traceback") and "ValueError: bad\nthing" in entry["exception"]
    assert entry["message"] == "client said 'é\\n'\x1b[2J\u2028"


def test_an_access_line_has_the_client_method_path_and_status_as_fields() -> None:
    access = record("uvicorn.access", '%s - "%s %s HTTP/%s" %d', ("10.0.0.7:5514", "POST", "/api/v1/reports?x=1",
                                                                   "1.1", 202), logging.INFO)
    entry = json.loads(JsonFormatter().format(access))
    assert {k: entry[k] for k in ("client", "method", "path", "status")} == \
        {"client": "10.0.0.7:5514", "method": "POST", "path": "/api/v1/reports?x=1", "status": 202}
    assert entry["message"] == '10.0.0.7:5514 - "POST /api/v1/reports?x=1 HTTP/1.1" 202'
    assert TEXT_LINE.match(TextFormatter().format(access))


def test_uvicorns_loggers_hand_their_lines_to_the_one_handler() -> None:
    config = logging_config("debug", "json")
    assert config["root"]["handlers"] == ["stderr"] and config["root"]["level"] == logging.DEBUG
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        assert config["loggers"][name] == {"handlers": [], "propagate": True}
    assert logging_config("trace", "text")["root"]["level"] == 5


def test_the_agents_v_is_log_level_debug() -> None:
    assert parse_config(["--once", "-v"], {})[1].log_level == "debug"
    assert parse_config(["--once", "--log-level", "error", "--verbose"], {})[1].log_level == "debug"
    assert parse_config(["--once"], {"HANGWATCH_LOG_LEVEL": "error"})[1].log_level == "error"


# --- real daemons ---

def logged(log: Path, wanted: Callable[[list[str]], bool], timeout: float = 10.0) -> list[str]:
    """The log's lines once ``wanted`` holds of them (polled to a deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = log.read_text(errors="replace").splitlines()
        if wanted(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def parsed(lines: list[str]) -> list[dict]:
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return entries


@pytest.fixture(scope="module")
def monitor_from_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The real monitor, every setting from its config file: (its address, its log)."""
    workdir = tmp_path_factory.mktemp("monitor")
    port = free_port()
    config = workdir / "monitor.toml"
    config.write_text(f'port = {port}\nlog_format = "json"\nlog_level = "debug"\n'
                      f'[monitor]\ndb = "{workdir / "state" / "monitor.db"}"\nmax_body_bytes = 2048\n')
    log = workdir / "monitor.log"
    with log.open("w") as out:
        proc = subprocess.Popen([EXE, "--config", str(config)], stdout=out, stderr=subprocess.STDOUT, text=True,
                                env=clean_env())
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(proc, base, log=log)
        yield base, log
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.live
def test_the_monitor_serves_with_the_settings_of_its_file(monitor_from_file: tuple[str, Path]) -> None:
    base, _ = monitor_from_file
    headers = {"content-type": "application/json"}
    assert httpx.post(f"{base}/api/v1/reports", content=b"{" + b" " * 4096 + b"}", headers=headers,
                      timeout=5).status_code == 413  # past the file's 2048 bytes (the default is 8 MiB)
    assert httpx.post(f"{base}/api/v1/reports", content=b"{}", headers=headers, timeout=5).status_code != 413


@pytest.mark.live
def test_every_line_of_the_monitor_is_json_uvicorns_included(monitor_from_file: tuple[str, Path]) -> None:
    base, log = monitor_from_file
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    entries = parsed(logged(log, lambda lines: any('"/healthz"' in line for line in lines)))
    by_logger = {entry["logger"]: entry for entry in entries}
    assert {"hangwatch.monitor", "uvicorn.error", "uvicorn.access"} <= by_logger.keys(), by_logger.keys()
    assert any(e["message"].startswith(f"Uvicorn running on {base}") for e in entries if e["logger"] == "uvicorn.error")
    assert any(e["message"].startswith("settings from ") and e["message"].split()[2].endswith("monitor.toml")
               for e in entries if e["logger"] == "hangwatch.monitor"), entries
    access = [e for e in entries if e.get("path") == "/healthz"][-1]
    assert (access["method"], access["status"], access["level"]) == ("GET", 200, "info")
    assert access["client"].startswith("127.0.0.1:")


@pytest.mark.live
def test_the_relay_logs_json_or_one_text_format(monitor_from_file: tuple[str, Path], tmp_path: Path) -> None:
    monitor, _ = monitor_from_file
    relays = {}
    for log_format in ("json", "text"):
        port, log = free_port(), tmp_path / f"relay-{log_format}.log"
        with log.open("w") as out:
            proc = subprocess.Popen([RELAY_EXE, "--monitor", monitor, "--port", str(port), "--log-level", "debug"],
                                    stdout=out, stderr=subprocess.STDOUT, text=True,
                                    env=clean_env(HANGWATCH_LOG_FORMAT=log_format))
        relays[log_format] = (proc, f"http://127.0.0.1:{port}", log)
    try:
        for proc, base, log in relays.values():
            wait_until_up(proc, base, log=log)
            assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        _, _, json_log = relays["json"]
        entries = parsed(logged(json_log, lambda lines: any('"/healthz"' in line for line in lines)))
        assert {"hangwatch.relay", "uvicorn.error", "uvicorn.access"} <= {e["logger"] for e in entries}
        assert any(e.get("path") == "/healthz" and e.get("status") == 200 for e in entries)
        _, _, text_log = relays["text"]
        lines = logged(text_log, lambda lines: any("/healthz" in line for line in lines))
        assert all(TEXT_LINE.match(line) for line in lines), lines
        for seen in (" WARNING hangwatch.relay: no token file", " INFO uvicorn.error: Uvicorn running on",
                     ' INFO uvicorn.access: 127.0.0.1:'):
            assert any(seen in line for line in lines), (seen, lines)
    finally:
        for proc, _, _ in relays.values():
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.live
def test_the_agent_logs_json_from_its_file_at_its_level(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('log_format = "json"\n')
    # A misspelt variable: a warning every run logs, wherever it runs.
    env = clean_env(HANGWATCH_CONFIG=str(config), HANGWATCH_TOKEN_FLE="x")
    done = subprocess.run(AGENT_CMD, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    entries = parsed(done.stderr.splitlines())
    assert any(e["level"] == "warning" and "HANGWATCH_TOKEN_FLE" in e["message"] for e in entries), entries
    assert any(e["message"].startswith(f"settings from {config} ") for e in entries), entries
    assert "ranks" in json.loads(done.stdout)  # the report stays alone on stdout

    quiet = subprocess.run([*AGENT_CMD, "--log-level", "error"], env=env, capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0 and "HANGWATCH_TOKEN_FLE" not in quiet.stderr, quiet.stderr
