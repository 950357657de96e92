"""Unknown HANGWATCH_* variables are named at start; the list of known ones is held to the code."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from real_monitor import running_monitor

from agent.settings import AgentSettings
from hangwatch_common import env_names
from hangwatch_common.env_names import (
    KNOWN,
    PREFIX,
    TEST_PREFIX,
    closest_known,
    unknown_variables,
    unknown_variables_warning,
)
from hangwatch_common.settings import declared, env_names as settings_env_names
from monitor.relay.cli import RelaySettings
from monitor.web.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
# Where hangwatch's variables are read or set: the programs, the deployment, the scripts, the
# benchmarks and the tests (their environment reaches real monitors and agents), the docs people copy from.
SOURCES = ("agent", "monitor", "hangwatch", "hangwatch_common", "deploy", "scripts", "benchmarks", "tests", "docs",
           "dashboards", ".ci", "Dockerfile", "README.md", "pyproject.toml")
# These spell unknown names on purpose.
TYPO_TESTS = {Path(__file__).resolve(), ROOT / "tests" / "agent" / "test_env_warning.py",
              ROOT / "tests" / "test_settings_declared.py", ROOT / "tests" / "test_config_file.py",
              ROOT / "tests" / "test_log_format.py"}
# A name, not a pattern in prose (HANGWATCH_SSL_*) nor a placeholder (HANGWATCH_<SETTING>).
NAME = re.compile(r"\bHANGWATCH_[A-Z0-9_]+\b(?!\*)")


def spelled_names(roots: tuple[str, ...] = SOURCES, skip: set[Path] = TYPO_TESTS) -> dict[str, set[str]]:
    """Every HANGWATCH_* name in the files under ``roots`` -> the files that spell it."""
    found: dict[str, set[str]] = {}
    for root in roots:
        top = ROOT / root
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts or path.resolve() in skip or path.stat().st_size > 2_000_000:
                continue
            for name in NAME.findall(path.read_text(errors="ignore")):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


# --- the list against the code ---

def test_each_daemons_names_are_its_settings() -> None:
    assert env_names.MONITOR == {ENV_PREFIX + item.name.upper() for item in declared(Settings)}
    assert (env_names.AGENT, env_names.RELAY) == (settings_env_names(AgentSettings), settings_env_names(RelaySettings))


def test_every_name_the_sources_spell_is_known() -> None:
    """A new variable read anywhere (or a misspelt one in the docs) fails here until it is listed."""
    found = spelled_names()
    assert "HANGWATCH_TOKEN_FILE" in found and "HANGWATCH_MONITOR" in found  # the scan sees the sources
    unknown = {name: sorted(files) for name, files in found.items()
               if name not in KNOWN and not name.startswith(TEST_PREFIX)}
    assert not unknown, f"HANGWATCH_* names that hangwatch_common/env_names.py does not list: {unknown}"


def test_every_known_name_is_read_somewhere() -> None:
    """No stale entry: each listed name is a daemon's setting or spelled by the code or deployment."""
    lists = {ROOT / "hangwatch_common" / "env_names.py", ROOT / "hangwatch_common" / "declared_names.py"}
    code = spelled_names(("agent", "monitor", "hangwatch", "hangwatch_common", "deploy", "scripts", "Dockerfile"),
                         skip=TYPO_TESTS | lists)
    settings = set().union(*map(settings_env_names, (Settings, AgentSettings, RelaySettings)))
    assert KNOWN - settings - set(code) == set()


# --- the warning ---

def test_no_warning_when_every_name_is_known() -> None:
    env = {name: "1" for name in KNOWN} | {"PATH": "/usr/bin", "HANGWATCH_TEST_OUTAGE_S": "20"}
    assert unknown_variables_warning(env) is None


@pytest.mark.parametrize(("typo", "meant"), [
    ("HANGWATCH_TOKEN_FLE", "HANGWATCH_TOKEN_FILE"),
    ("HANGWATCH_MAXJOBS", "HANGWATCH_MAX_JOBS"),
    ("HANGWATCH_METRIC_TOKEN_FILE", "HANGWATCH_METRICS_TOKEN_FILE"),
    ("HANGWATCH_STATEDIR", "HANGWATCH_STATE_DIR"),
    ("hangwatch_port", "HANGWATCH_PORT"),  # names are case-sensitive: the lower-case one is not read
    ("HANGWATCH_FOO", None),
    ("HANGWATCH_HOSTNAME", None),
])
def test_a_close_known_name_is_suggested(typo: str, meant: str | None) -> None:
    assert closest_known(typo) == meant
    warning = unknown_variables_warning({typo: "x"})
    assert warning is not None and typo in warning
    assert (f"(did you mean {meant}?)" in warning) if meant else ("did you mean" not in warning)


def test_one_line_names_each_unknown_variable_never_its_value() -> None:
    env = {"HANGWATCH_TOKEN_FLE": "/etc/hangwatch/agents.tokens", "HANGWATCH_SECRET_THING": "s3cr3t-value",
           "HANGWATCH_PORT": "9000", "HANGWATCH_BAD\x1b[2J": "x", "OTHER_TOKEN_FLE": "y"}
    warning = unknown_variables_warning(env)
    assert warning is not None and "\n" not in warning and "\x1b" not in warning
    assert warning.startswith("ignoring 3 unknown HANGWATCH_* environment variables")
    assert "HANGWATCH_TOKEN_FLE (did you mean HANGWATCH_TOKEN_FILE?)" in warning
    assert "HANGWATCH_SECRET_THING" in warning and "'HANGWATCH_BAD\\x1b[2J'" in warning
    assert "s3cr3t" not in warning and "agents.tokens" not in warning
    assert "HANGWATCH_PORT" not in warning and "OTHER_" not in warning
    assert PREFIX == ENV_PREFIX


# --- the real monitor ---

def logged_within(monitor, text: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in monitor.log_text():
            return True
        time.sleep(0.05)
    return False


def test_the_monitor_warns_of_a_misspelt_variable_and_still_starts(tmp_path: Path) -> None:
    tokens = tmp_path / "agents.tokens"
    env = {"HANGWATCH_TOKEN_FLE": str(tokens), "HANGWATCH_MAX_JOBS": "5", "HANGWATCH_AGENT_ARGS": "--no-stacks"}
    (tmp_path / "typo").mkdir()
    (tmp_path / "clean").mkdir()
    with running_monitor(tmp_path / "typo", extra_env=env) as monitor:
        assert logged_within(monitor, "HANGWATCH_TOKEN_FLE (did you mean HANGWATCH_TOKEN_FILE?)")
        (line,) = [line for line in monitor.log_text().splitlines() if "unknown HANGWATCH_" in line]
        assert "WARNING" in line and str(tokens) not in line
        # Only the typo (and whatever unknown the test's own environment brings along).
        inherited = len(unknown_variables(os.environ))
        assert f"ignoring {1 + inherited} unknown" in line, line
        assert "HANGWATCH_MAX_JOBS" not in line and "HANGWATCH_AGENT_ARGS" not in line
        # The typo left the monitor without a token file, and it says so too; it serves.
        assert "no token file" in monitor.log_text()
        assert monitor.proc.poll() is None

    with running_monitor(tmp_path / "clean", extra_env={"HANGWATCH_MAX_JOBS": "5"}) as monitor:
        assert logged_within(monitor, "no token file")  # logged after the variables are looked at
        if not unknown_variables(os.environ):
            assert "unknown HANGWATCH_" not in monitor.log_text()
