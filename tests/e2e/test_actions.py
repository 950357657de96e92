"""From verdict to action, end to end: a real gloo deadlock, a real monitor with an actions file and
a capture delay, a real agent with a node-bound token that allows signals (one job for all, to
keep the suite short).

- Evidence captured at the moment: held past the capture delay, the deadlock makes the agent take
  native stacks and log tails of the job's ranks and upload them; the bundle is listed on the
  job's history answer and downloads as a tar a person can open after the job is gone.
- Opt-in actions: held past each rule's delay, it runs a command (the job's identity on its
  stdin) and has the agent send SIGTERM to the culprit rank, which ends the job; the audit log,
  the job's history answer and /metrics say so."""

from __future__ import annotations

import gzip
import io
import json
import sys
import tarfile
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


def test_a_held_deadlock_is_captured_then_acted_on_and_the_job_ends(reaper: Reaper, tmp_path: Path) -> None:
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
after_s = 12
signal = "SIGTERM"
""")
    tokens = _secret(tmp_path / "agents.tokens", f"{NODE} {TOKEN}\n")
    # The capture (asked 1 s into the deadlock, about half a second of dumps, but a dump waits up to
    # 10 s for one of the rank already under way) comes before the signal (12 s) ends the ranks: CI
    # once saw the signal first, and the capture found a rank gone.
    monitor = start_monitor(reaper, tmp_path, settings={"HANGWATCH_ACTIONS_FILE": str(actions),
                                                       "HANGWATCH_TOKEN_FILE": str(tokens),
                                                       "HANGWATCH_CAPTURE_AFTER_S": "1"})
    start_agent(reaper, tmp_path, monitor.url, extra=["--node", NODE, "--allow-signals",
                                                      "--token-file", str(_secret(tmp_path / "agent.token", TOKEN))])
    job = launch_torchrun(reaper, tmp_path, ["--fail", "linger", "--fail-at-step", "40"])
    pids = job.rank_pids(timeout=30)
    client = MonitorClient(monitor.url)
    try:
        _deadlock_acted_on(client, monitor.url, job, pids[1], called)
    finally:
        client.close()
    _deadlock_captured(monitor.url, job, pids)


def _bundle(url: str, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    found: list[dict] = []
    while time.monotonic() < deadline:
        found = httpx.get(f"{url}/api/v1/captures", params={"job": job_id}, timeout=5).json()["captures"]
        if found and found[0]["nodes_received"] == found[0]["nodes_asked"]:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no complete capture after {timeout}s: {found}")


def _deadlock_captured(url: str, job, pids: dict[int, int]) -> None:
    bundle = _bundle(url, job.job_id)
    assert bundle["nodes_asked"] == 1 and bundle["bytes"] > 0 and bundle["refused"] == {}, bundle
    assert bundle["verdict"] in ("deadlock", "stalled")
    history = httpx.get(f"{url}/api/v1/jobs/{job.job_id}/history", timeout=5).json()
    assert [c["id"] for c in history["captures"]] == [bundle["id"]]
    # The download, after the job ended: bundle.json and one gzipped part per node.
    tar_bytes = httpx.get(f"{url}{bundle['download']}", timeout=30).content
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        meta = json.loads(tar.extractfile(f"{bundle['id']}/bundle.json").read())
        [part_name] = [n for n in tar.getnames() if n.endswith(".json.gz")]
        part = json.loads(gzip.decompress(tar.extractfile(part_name).read()))
    assert meta["job_id"] == job.job_id and set(meta["nodes"]) == set(meta["received"]) == {NODE}
    ranks = {r["rank"]: r for r in part["ranks"]}
    assert set(ranks) == {0, 1} and {r["pid"] for r in ranks.values()} == set(pids.values())
    for r in ranks.values():
        assert r["errors"] == {}, r["errors"]
        # Native, or (py-spy's native unwinding fails now and then) Python frames with the failure said.
        assert r["stack"]["native"] is True or r["stack"]["native_error"], r["stack"]
        assert r["stack"]["threads"], r["stack"]
    waiting = [f["name"] for f in ranks[0]["stack"]["threads"][0]["frames"]]
    assert "all_reduce" in waiting, waiting
    lingering = [f["name"] for f in ranks[1]["stack"]["threads"][0]["frames"]]
    assert "linger_forever" in lingering, lingering
    assert any("waiting for the others" in text for text in ranks[1]["logs"].values()), ranks[1]["logs"]


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
