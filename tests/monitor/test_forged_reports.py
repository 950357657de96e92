"""A forged report can neither act nor hide (issue 33), probed as an attacker holding one node's
token against a real monitor (uvicorn on loopback) with node-bound tokens and command rules that
would run `scancel` and `kubectl delete pod` (here a script that records its arguments). One
monitor for the module: each probe has jobs of its own. The signal probe, with the real agent, is
tests/monitor/test_signal_order_targets.py; numbering, tests/monitor/test_report_order.py; quotas,
tests/monitor/test_sender_quotas.py."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import RunningMonitor, running_monitor

pytestmark = pytest.mark.live
REPORTS = "/api/v1/reports"
N1, N2 = "n1-token-0123456789abcdef", "n2-token-0123456789abcdef"
VERDICTS = '["rank_stopped", "rank_exited"]'


@pytest.fixture(scope="module")
def monitor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningMonitor, Path]]:
    tmp = tmp_path_factory.mktemp("forged")
    called = tmp / "called.jsonl"
    record = f"import json, sys; open({str(called)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')"
    run = f"{json.dumps(sys.executable)}, \"-c\", {json.dumps(record)}"
    actions = tmp / "actions.toml"
    actions.write_text(f"""dry_run = false
max_actions = 100
[[rule]]
name = "cancel"
verdicts = {VERDICTS}
after_s = 0
command = [{run}, "scancel", "{{slurm_job}}"]

[[rule]]
name = "delete-pods"
verdicts = {VERDICTS}
after_s = 0
command = [{run}, "kubectl", "delete", "pod", "-n", "{{k8s_namespace}}", "{{k8s_pods}}"]
""")
    tokens = tmp / "agents.tokens"
    tokens.write_text(f"n1 {N1}\nn2 {N2}\n")
    tokens.chmod(0o600)
    with running_monitor(tmp, "--actions", str(actions), "--token-file", str(tokens)) as running:
        yield running, called


def _post(base: str, node: str, token: str, ranks: list[dict]) -> None:
    answer = httpx.post(base + REPORTS, json=report(node=node, ranks=ranks, sent_at=time.time()),
                        headers={"authorization": f"Bearer {token}"}, timeout=5)
    assert answer.status_code == 202, answer.text


def _audit(base: str, job: str) -> list[dict]:
    return httpx.get(base + "/api/v1/actions", params={"job": job}, timeout=5).json()["actions"]


def _calls(called: Path) -> list[list[str]]:
    return [json.loads(line) for line in called.read_text().splitlines()] if called.exists() else []


def test_placeholders_from_a_forged_environment_refuse_the_commands(monitor) -> None:
    running, called = monitor
    env = {"SLURM_JOB_ID": "--user=root", "POD_NAMESPACE": "kube-system", "POD_NAME": "--all"}
    ranks = [rank(job_id="forged-env", rank=0, pid=3000, env=env),
             rank(job_id="forged-env", rank=1, pid=3001, state="T", cpu_percent=0.0, env=env)]
    deadline = time.monotonic() + 20
    while len(entries := _audit(running.base, "forged-env")) < 2:
        assert time.monotonic() < deadline, f"no audit entries: {entries}"
        _post(running.base, "n1", N1, ranks)
        time.sleep(0.3)
    outcomes = {e["rule"]: (e["outcome"], e["detail"]) for e in entries}
    assert outcomes["cancel"][0] == "refused" and outcomes["cancel"][1].startswith("{slurm_job} is '--user=root'")
    assert outcomes["delete-pods"][0] == "refused" and outcomes["delete-pods"][1].startswith("{k8s_pods} is '--all'")
    assert not [c for c in _calls(called) if "--user=root" in c or "--all" in c], _calls(called)


def test_another_node_cannot_add_a_failed_rank_to_a_job_it_has_no_part_in(monitor) -> None:
    """n2's token says "rank 2 failed" into n1's 2-rank job: refused as past the world, no verdict
    names it, and no rule runs against the real job."""
    running, called = monitor
    real = [rank(job_id="real-job", rank=r, pid=4000 + r, env={"SLURM_JOB_ID": "4242"}) for r in (0, 1)]
    failed = rank(job_id="real-job", rank=2, pid=9002, world_size=3, alive=False,
                  exit={"at": time.time(), "code": 1, "source": "proc"}, env={"SLURM_JOB_ID": "4242"})
    deadline = time.monotonic() + 20
    while True:
        _post(running.base, "n1", N1, real)
        _post(running.base, "n2", N2, [failed])
        job = httpx.get(running.base + "/diagnose", params={"job": "real-job", "format": "json"}, timeout=5).json()
        conflicts = job["jobs"][0]["rank_conflicts"] if job.get("jobs") else []
        if conflicts:
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    assert conflicts[0]["rank"] == 2 and conflicts[0]["claimed_by"] == "n2", conflicts
    assert "past the world size 2" in conflicts[0]["reason"], conflicts
    # Judged again over a few passes: the refused rank never becomes a verdict or an action.
    for _ in range(6):
        _post(running.base, "n1", N1, real)
        _post(running.base, "n2", N2, [failed])
        job = httpx.get(running.base + "/diagnose", params={"job": "real-job", "format": "json"}, timeout=5).json()
        assert job["jobs"][0]["verdict"] != "rank_exited" and 2 not in job["jobs"][0]["culprit_ranks"], job["jobs"][0]
        assert sorted(r["rank"] for r in job["jobs"][0]["ranks"]) == [0, 1]
        time.sleep(0.5)
    assert _audit(running.base, "real-job") == []
    assert not [c for c in _calls(called) if "4242" in c], _calls(called)
