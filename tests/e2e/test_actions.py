"""Opt-in actions end to end: a real gloo deadlock, a real monitor with an actions file, a real agent
with a node-bound token that allows signals. The deadlock held past each rule's delay runs a
command (the job's identity on its stdin) and has the agent send SIGTERM to the culprit rank,
which ends the job; the audit log, the job's history answer and /metrics say so."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from hangwatch.demo.harness import MonitorClient, Reaper, launch_torchrun, start_agent, start_monitor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
NODE = "actions-node"
TOKEN = "actions-node-token-0123456789abcdef"


def _secret(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def _audit(client: MonitorClient, job_id: str, rules: set[str], timeout: float = 60) -> dict[str, dict]:
    """The job's audit entries by rule, once every rule in ``rules`` has one that is not pending."""
    deadline = time.monotonic() + timeout
    entries: dict[str, dict] = {}
    while time.monotonic() < deadline:
        answer = httpx.get(f"{client.url}/api/v1/actions", params={"job": job_id}, timeout=5).json()
        entries = {a["rule"]: a for a in answer["actions"]}
        if rules <= set(entries):
            return entries
        time.sleep(0.5)
    raise AssertionError(f"audit log after {timeout}s: {entries}")


def test_a_deadlock_runs_the_command_and_the_culprits_signal_which_ends_the_job(reaper: Reaper, tmp_path: Path) -> None:
    called = tmp_path / "called.jsonl"
    record = f"import sys; open({str(called)!r}, 'a').write(sys.stdin.read() + '\\n')"
    actions = tmp_path / "actions.toml"
    actions.write_text(f"""
dry_run = false
[[rule]]
name = "record"
verdicts = ["deadlock"]
after_s = 1
command = [{json.dumps(sys.executable)}, "-c", {json.dumps(record)}, "{{job_id}}"]

[[rule]]
name = "restart-culprits"
verdicts = ["deadlock", "stalled"]
after_s = 2
signal = "SIGTERM"
""")
    tokens = _secret(tmp_path / "agents.tokens", f"{NODE} {TOKEN}\n")
    monitor = start_monitor(reaper, tmp_path, settings={"HANGWATCH_ACTIONS_FILE": str(actions),
                                                       "HANGWATCH_TOKEN_FILE": str(tokens)})
    start_agent(reaper, tmp_path, monitor.url, extra=["--node", NODE, "--allow-signals",
                                                      "--token-file", str(_secret(tmp_path / "agent.token", TOKEN))])
    job = launch_torchrun(reaper, tmp_path, ["--fail", "linger", "--fail-at-step", "40"])
    culprit_pid = job.rank_pids(timeout=30)[1]
    client = MonitorClient(monitor.url)
    try:
        _deadlock_acted_on(client, monitor.url, job, culprit_pid, called)
    finally:
        client.close()


def _deadlock_acted_on(client: MonitorClient, url: str, job, culprit_pid: int, called: Path) -> None:
    client.wait_for_verdict(job.job_id, "deadlock", 60, culprits=[1])

    entries = _audit(client, job.job_id, {"record", "restart-culprits"})
    # The job ends: its launcher saw rank 1 killed by the agent's SIGTERM and tore the rest down.
    assert job.launcher is not None
    assert job.launcher.wait(timeout=60) != 0
    signal_entry = entries["restart-culprits"]
    assert signal_entry["outcome"] == "ok", signal_entry
    assert signal_entry["culprit_ranks"] == [1] and signal_entry["culprit_nodes"] == [NODE]
    assert f"sent SIGTERM to rank 1 (pid {culprit_pid})" in signal_entry["detail"], signal_entry
    command_entry = entries["record"]
    assert command_entry["outcome"] == "ok" and command_entry["kind"] == "command", command_entry
    assert command_entry["target"].endswith(job.job_id), command_entry
    told = [json.loads(line) for line in called.read_text().splitlines()]
    assert len(told) == 1, told  # once per incident, however long the deadlock held
    assert told[0]["job_id"] == job.job_id and told[0]["verdict"] == "deadlock" and told[0]["culprit_ranks"] == [1]
    assert told[0]["culprits"] == [{"rank": 1, "node": NODE, "pid": culprit_pid}]

    # On the incident: the job's history answer carries its actions; /metrics counts them.
    history = httpx.get(f"{url}/api/v1/jobs/{job.job_id}/history", timeout=5).json()
    assert {a["rule"] for a in history["actions"]} == {"record", "restart-culprits"}
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'hangwatch_actions_total{rule="restart-culprits",kind="signal",outcome="ok"} 1' in metrics
    assert 'hangwatch_actions_total{rule="record",kind="command",outcome="ok"} 1' in metrics
