"""The daemons import httpx without its command-line tool (hangwatch_common/http_client.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What httpx's CLI alone brings in, among what the agent loads. (uvicorn brings click for its own
# CLI, so the relay and the monitor load it all the same; rich is hangwatch's, for its CLI's table.)
CLI_ONLY = ("httpx._main", "click", "pygments")

PROBE = f"""
import json, sys
import agent.cli
after_agent = sorted(m for m in {CLI_ONLY!r} if sys.modules.get(m) is not None)
import monitor.relay.cli  # the relay posts with httpx too
import httpx
print(json.dumps({{"after_agent": after_agent, "cli_module": sys.modules.get("httpx._main") is not None,
                  "client": httpx.Client.__module__, "main": httpx.main.__module__}}))
"""


@pytest.mark.live  # a fresh interpreter: what a daemon's start imports
def test_the_agent_and_the_relay_import_httpx_without_its_cli() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["after_agent"] == [], seen
    assert seen["cli_module"] is False, seen
    assert seen["client"] == "httpx", seen  # httpx itself is whole
    assert seen["main"] == "httpx", seen  # the stub httpx defines where its CLI cannot be imported
