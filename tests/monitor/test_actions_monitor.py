"""Opt-in actions in a real monitor (uvicorn on loopback), driven by reports: who gets a signal
order, what the audit log says, and when the monitor refuses to act (shared tokens, a claimed
rank, dry run). tests/e2e/test_actions.py runs the whole loop on a real job."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import running_monitor

pytestmark = pytest.mark.live
REPORTS = "/api/v1/reports"
NODE_A, NODE_B = "node-a-token-0123456789abcdef", "node-b-token-0123456789abcdef"
RULE = '[[rule]]\nname = "stop-culprits"\nverdicts = ["rank_stopped"]\nafter_s = 0\nsignal = "SIGTERM"\n'
CANCEL = '[[rule]]\nname = "cancel"\nverdicts = ["rank_stopped"]\nafter_s = 0\ncommand = ["scancel", "--", "{slurm_job}"]\n'


def _files(tmp_path: Path, dry_run: bool | None, bound: bool = True, rules: str = RULE) -> list[str]:
    """The actions file (``dry_run`` None: left to its default) and the agents' token file."""
    actions = tmp_path / "actions.toml"
    actions.write_text(("" if dry_run is None else f"dry_run = {str(dry_run).lower()}\n") + rules)
    tokens = tmp_path / "agents.tokens"
    tokens.write_text(f"node-a {NODE_A}\nnode-b {NODE_B}\n" if bound else f"{NODE_A}\n")
    tokens.chmod(0o600)
    return ["--actions", str(actions), "--token-file", str(tokens)]


def _post(base: str, node: str, token: str, ranks: list[dict], **fields) -> dict:
    answer = httpx.post(base + REPORTS, json=report(node=node, ranks=ranks, sent_at=time.time(), **fields),
                        headers={"authorization": f"Bearer {token}"}, timeout=5)
    assert answer.status_code == 202, answer.text
    return answer.json()


def _ranks(state: str) -> list[dict]:
    env = {"SLURM_JOB_ID": "77"}
    return [rank(job_id="job-s", rank=0, pid=2000, cpu_percent=0.0, env=env),
            rank(job_id="job-s", rank=1, pid=2001, state=state, cpu_percent=0.0, started_at=123.0, env=env)]


def _audit(base: str, timeout: float = 15, entries: int = 1) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = httpx.get(base + "/api/v1/actions", params={"job": "job-s"}, timeout=5).json()["actions"]
        if len(found) >= entries:
            return found
        time.sleep(0.2)
    raise AssertionError("no audit entry")


def _stop_rank_1(base: str, token: str = NODE_A, also: tuple[dict, ...] = ()) -> list[dict]:
    """Report rank 1 stopped (and the ranks ``also``) until the audit log has a decision; the
    answers' orders, if any."""
    orders: list[dict] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        orders += _post(base, "node-a", token, [*_ranks("T"), *also]).get("orders", [])
        if httpx.get(base + "/api/v1/actions", params={"job": "job-s"}, timeout=5).json()["actions"] or orders:
            break
        time.sleep(0.5)
    orders += _post(base, "node-a", token, [*_ranks("T"), *also]).get("orders", [])
    return orders


def test_a_signal_order_goes_to_the_culprits_node_and_its_answer_lands_in_the_audit_log(tmp_path: Path) -> None:
    with running_monitor(tmp_path, *_files(tmp_path, dry_run=False)) as monitor:
        orders = _stop_rank_1(monitor.base)
        # The job as the node spelled it, the rank, its pid and start: the agent checks all of them.
        assert [(o["signal"], o["job_id"], o["rank"], o["pid"], o["started_at"]) for o in orders] == \
            [("SIGTERM", "job-s", 1, 2001, 123.0)]
        # The agent says what it did in its next report; the action is then recorded with it.
        results = [{"id": orders[0]["id"], "ok": True, "detail": "sent SIGTERM to rank 1 (pid 2001)"}]
        _post(monitor.base, "node-a", NODE_A, _ranks("T"), order_results=results)
        [entry] = _audit(monitor.base)
        assert (entry["rule"], entry["kind"], entry["outcome"]) == ("stop-culprits", "signal", "ok"), entry
        assert entry["detail"] == "sent SIGTERM to rank 1 (pid 2001)"
        assert entry["target"] == "SIGTERM to rank 1 (pid 2001 on node-a)"
        assert (entry["verdict"], entry["culprit_ranks"], entry["culprit_nodes"]) == ("rank_stopped", [1], ["node-a"])
        # Once per incident: the verdict holds, nothing more is ordered.
        assert all("orders" not in _post(monitor.base, "node-a", NODE_A, _ranks("T")) for _ in range(3))
        assert len(httpx.get(monitor.base + "/api/v1/actions", timeout=5).json()["actions"]) == 1


def test_dry_run_records_what_it_would_do_and_orders_nothing(tmp_path: Path) -> None:
    with running_monitor(tmp_path, *_files(tmp_path, dry_run=True)) as monitor:
        assert _stop_rank_1(monitor.base) == []
        [entry] = _audit(monitor.base)
        assert entry["outcome"] == "dry_run" and entry["detail"] == "would send SIGTERM to rank 1 (pid 2001 on node-a)"
        body = httpx.get(monitor.base + "/api/v1/actions", timeout=5).json()
        assert body["enabled"] and body["dry_run"] and body["rules"][0]["name"] == "stop-culprits"


def test_a_default_set_up_audits_unattributed_with_what_each_rule_would_have_done(tmp_path: Path) -> None:
    """No node-bound token and the default dry run (the recommended first week): nothing acts, and the
    audit log, where users read it, says what each rule would have done, why it did not, and the fix."""
    files = _files(tmp_path, dry_run=None, bound=False, rules=RULE + CANCEL)
    with running_monitor(tmp_path, *files) as monitor:
        assert _stop_rank_1(monitor.base) == []
        entries = {e["rule"]: e for e in _audit(monitor.base, entries=2)}
        why = "not run: node node-a reports with a shared token (or none): another client could have spoken for it."
        cancel, stop = entries["cancel"], entries["stop-culprits"]
        assert (cancel["outcome"], cancel["ran"], cancel["target"]) == ("unattributed", False, "scancel -- 77"), cancel
        assert cancel["detail"].startswith(f"{why} The rule would run: scancel -- 77. To let it act: give each node "
                                           "its own token"), cancel
        assert (stop["outcome"], stop["target"]) == ("unattributed", "SIGTERM to rank 1 (pid 2001 on node-a)"), stop
        assert f"{why} The rule would send SIGTERM to rank 1 (pid 2001 on node-a)." in stop["detail"], stop
        # The job's history answer (what the page shows under the job) carries the same entries.
        history = httpx.get(monitor.base + "/api/v1/jobs/job-s/history", timeout=5).json()
        assert {a["rule"]: a["detail"] for a in history["actions"]} == \
            {rule: e["detail"] for rule, e in entries.items()}, history["actions"]
        assert httpx.get(monitor.base + "/api/v1/actions", timeout=5).json()["dry_run"] is True


def test_no_action_while_another_node_claims_a_rank_of_the_job(tmp_path: Path) -> None:
    with running_monitor(tmp_path, *_files(tmp_path, dry_run=False)) as monitor:
        _post(monitor.base, "node-a", NODE_A, _ranks("S"))
        _post(monitor.base, "node-b", NODE_B, [rank(job_id="job-s", rank=1, pid=9001)])
        assert _stop_rank_1(monitor.base) == []
        [entry] = _audit(monitor.base)
        assert entry["outcome"] == "unattributed" and "node node-b claimed rank 1" in entry["detail"], entry


def test_no_signal_on_a_pid_the_node_also_reports_as_a_rank_of_another_job(tmp_path: Path) -> None:
    # node-a says pid 2001 is the stopped rank 1 of job-s and rank 0 of job-t: one is a lie, and a
    # signal meant for the one could end the other.
    other_job = rank(job_id="job-t", rank=0, world_size=1, pid=2001, started_at=123.0)
    with running_monitor(tmp_path, *_files(tmp_path, dry_run=False)) as monitor:
        assert _stop_rank_1(monitor.base, also=(other_job,)) == []
        [entry] = _audit(monitor.base)
        assert entry["outcome"] == "unattributed", entry
        assert entry["detail"].startswith("no SIGTERM ordered: node node-a reports pid 2001 as rank 1 of job job-s "
                                          "and as rank 0 of job job-t"), entry


def test_actions_are_off_without_the_file(tmp_path: Path) -> None:
    with running_monitor(tmp_path) as monitor:
        assert httpx.get(monitor.base + "/api/v1/actions", timeout=5).json() == \
            {"enabled": False, "dry_run": None, "actions": []}
        assert "orders" not in httpx.post(monitor.base + REPORTS, json=report(ranks=_ranks("T")), timeout=5).json()
