"""The real agent names a misspelt HANGWATCH_* variable at start and goes on (spelt wrong on purpose:
tests/monitor/test_env_names.py leaves this file out of its scan)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_agent_once(**env: str) -> subprocess.CompletedProcess[str]:
    # --once: one report on stdout, no monitor; --no-stacks: no py-spy, nothing to wait on.
    # Only the variables given here: none the test's own environment may bring along.
    inherited = {k: v for k, v in os.environ.items() if not k.upper().startswith("HANGWATCH_")}
    return subprocess.run([sys.executable, "-m", "agent.cli", "--once", "--no-stacks", "--interval", "0.1"],
                          env={**inherited, **env}, capture_output=True, text=True, timeout=60)


def test_agent_warns_of_a_misspelt_variable_and_still_runs() -> None:
    done = run_agent_once(HANGWATCH_TOKEN_FLE="/etc/hangwatch/agent.token", HANGWATCH_DUMP_OTHER_USER="1",
                          HANGWATCH_MAX_JOBS="5", HANGWATCH_MONITOR="http://127.0.0.1:9")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "unknown HANGWATCH_" in line]
    assert "WARNING" in line and "ignoring 2 unknown" in line, line
    assert "HANGWATCH_TOKEN_FLE (did you mean HANGWATCH_TOKEN_FILE?)" in line
    assert "HANGWATCH_DUMP_OTHER_USER (did you mean HANGWATCH_DUMP_OTHER_USERS?)" in line
    # A monitor setting shared through one environment is no typo; values are never shown.
    assert "HANGWATCH_MAX_JOBS" not in line and "HANGWATCH_MONITOR" not in line and "agent.token" not in line
    assert "ranks" in json.loads(done.stdout)


def test_agent_says_nothing_of_known_variables() -> None:
    done = run_agent_once(HANGWATCH_MAX_JOBS="5", HANGWATCH_CA_FILE="")
    assert done.returncode == 0, done.stderr
    assert "unknown HANGWATCH_" not in done.stderr and "ranks" in json.loads(done.stdout)
