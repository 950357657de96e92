"""What a daemon's or the CLI's start leaves out: httpx's own CLI (hangwatch_common/http_client.py)
and, for ``hangwatch``, the diagnosis model and rules (monitor/diagnosis/__init__.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What httpx's CLI alone brings in, among what the agent loads. (uvicorn brings click for its own
# CLI, so the relay and the monitor load it all the same; rich is hangwatch's, for its CLI's table.)
HTTPX_CLI_ONLY = ("httpx._main", "click", "pygments")
DIAGNOSIS = ("monitor.diagnosis.model", "monitor.diagnosis.verdict")

PROBE = f"""
import json, sys
def loaded(names):
    return sorted(m for m in names if sys.modules.get(m) is not None)
import hangwatch.cli
after_cli = loaded({DIAGNOSIS!r})
import agent.cli
after_agent = loaded({HTTPX_CLI_ONLY!r})
import monitor.relay.cli  # the relay posts with httpx too
import httpx
from monitor.diagnosis import RankView, diagnose  # still there when asked for
print(json.dumps({{"after_cli": after_cli, "after_agent": after_agent,
                  "httpx_cli": sys.modules.get("httpx._main") is not None,
                  "client": httpx.Client.__module__, "main": httpx.main.__module__,
                  "asked": [RankView.__module__, diagnose.__module__]}}))
"""


@pytest.mark.live  # a fresh interpreter: what a start imports
def test_the_cli_and_the_daemons_import_only_what_they_use() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["after_cli"] == [], seen
    assert seen["after_agent"] == [], seen
    assert seen["httpx_cli"] is False, seen
    assert seen["client"] == "httpx", seen  # httpx itself is whole
    assert seen["main"] == "httpx", seen  # the stub httpx defines where its CLI cannot be imported
    assert seen["asked"] == ["monitor.diagnosis.model", "monitor.diagnosis.verdict"], seen
