"""A forged report cannot aim a signal at another job's rank (issue 33), with the real monitor and
the real agent.

Node n1 runs two jobs, each a tiny process the agent takes for rank 0 (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). Whoever holds n1's token posts, as n1, a picture of the first job whose
rank 0 is stopped (state T) and has the pid and start time of the second job's rank 0. A `signal`
rule on `rank_stopped` orders SIGUSR1 (which ends a process that does not handle it). The agent
places that pid in the second job, not the one the order names: it refuses, says so in its log, and
the refusal is the action's outcome in the monitor's audit log. The second job's rank lives.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psutil
import pytest

from hangwatch.demo.harness import Reaper, start_agent
from tests.agent.conftest import Ranks
from tests.monitor.monitor_reports import rank, report
from tests.monitor.real_monitor import running_monitor

pytestmark = [pytest.mark.live, pytest.mark.timeout(90)]
NODE, TOKEN = "n1", "n1-token-0123456789abcdef0123"
AGENT_INTERVAL_S = 2.0
TICK_S = 0.2
# The forged rank is posted stopped twice this far apart: the monitor names a stop seen that long.
STOP_SEEN_S = 1.6
RULE = '[[rule]]\nname = "wake-culprits"\nverdicts = ["rank_stopped"]\nafter_s = 0\nsignal = "SIGUSR1"\n'


def _secret(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def _two_jobs(tmp_path: Path) -> tuple[Ranks, Ranks]:
    (tmp_path / "cover").mkdir()
    (tmp_path / "victim").mkdir()
    cover = Ranks(tmp_path / "cover")
    victim = Ranks(tmp_path / "victim")
    while victim.port == cover.port:
        victim = Ranks(tmp_path / "victim")
    return cover, victim


def _last_report_at(base: str, job_id: str) -> float | None:
    """When the monitor last had a report listing ``job_id`` (its clock; None: not yet)."""
    answer = httpx.get(f"{base}/diagnose", params={"format": "json", "job": job_id}, timeout=5)
    jobs = answer.json()["jobs"] if answer.status_code == 200 else []
    return jobs[0]["last_report_at"] if jobs else None


def _audit(base: str, job_id: str) -> list[dict]:
    return [e for e in httpx.get(f"{base}/api/v1/actions", params={"job": job_id}, timeout=5).json()["actions"]
            if e["rule"] == "wake-culprits"]


def _post_forged(base: str, ranks: list[dict], run: dict, seq: int) -> str | None:
    """Post as n1; None when taken, else why not."""
    body = report(node=NODE, ranks=ranks, sent_at=time.time(), seq=seq, agent=run)
    answer = httpx.post(f"{base}/api/v1/reports", json=body, headers={"authorization": f"Bearer {TOKEN}"}, timeout=5)
    if answer.status_code != 202:
        return f"{answer.status_code} {answer.text}"
    # Orders go to whichever of n1's reports comes next: the forger stops before any is made.
    assert "orders" not in answer.json(), "the forged report took the order itself: the agent never saw it"
    return None


def _forge_until_answered(base: str, cover_job: str, victim_job: str, forged: list[dict],
                          timeout: float = 40.0) -> dict:
    """Right after one of the agent's reports, post the forged one twice (a stop seen for
    STOP_SEEN_S), then leave n1's next reports to the agent, which takes the order and answers it
    in the one after; again if the agent's picture came back before the monitor named the stop.
    The action's audit entry."""
    deadline = time.monotonic() + timeout
    seen: float | None = None
    refused: str | None = None
    while time.monotonic() < deadline:
        agent_at = _last_report_at(base, victim_job)  # the forged report does not list the victim's job
        if agent_at is None or agent_at == seen:
            time.sleep(0.05)
            continue
        seen = agent_at
        if time.time() - agent_at > 2 * TICK_S + 0.1:
            continue  # seen too late to be sure of getting in before the agent's next report
        # As a restarted agent would post: a run of its own, started after the node's current
        # one (so the monitor takes it as the node's new run), numbered from 1.
        run = {"version": "0.1.0", "pid": 4_000_000, "started_at": time.time(), "interval_s": 1.0, "py_spy": "ok"}
        refused = _post_forged(base, forged, run, seq=1)
        if refused is None:
            time.sleep(STOP_SEEN_S)
            refused = _post_forged(base, forged, run, seq=2)  # refused if the agent's new run overtook it
        if refused is not None:
            continue
        answered_by = time.monotonic() + 3 * AGENT_INTERVAL_S + 2
        while time.monotonic() < min(answered_by, deadline):
            entries = _audit(base, cover_job)
            if entries:
                return entries[0]
            time.sleep(0.1)
    raise AssertionError(f"no outcome for the signal action in {timeout:.0f}s (last forged report refused: "
                         f"{refused})")


def test_a_forged_report_cannot_aim_a_signal_at_another_jobs_rank(tmp_path: Path) -> None:
    cover, victim = _two_jobs(tmp_path)
    reaper = Reaper()
    try:
        cover.start(0, world_size=1)
        victim_rank = victim.start(0, world_size=1)
        actions = _secret(tmp_path / "actions.toml", f"dry_run = false\n{RULE}")
        tokens = _secret(tmp_path / "agents.tokens", f"{NODE} {TOKEN}\n")
        with running_monitor(tmp_path, "--actions", str(actions), "--token-file", str(tokens),
                             extra_env={"HANGWATCH_TICK_INTERVAL_S": str(TICK_S)}) as monitor:
            agent = start_agent(reaper, tmp_path, monitor.base, interval=AGENT_INTERVAL_S, extra=[
                "--node", NODE, "--allow-signals", "--token-file", str(_secret(tmp_path / "agent.token", TOKEN)),
                "--job", cover.job, "--job", victim.job, "--no-stacks", "--no-nccl-ras", "--no-flight-recorder"])
            # The forger is on the node: it reads the victim's start from /proc, as the agent does.
            forged = [rank(job_id=cover.job, rank=0, world_size=1, pid=victim_rank.pid, state="T", cpu_percent=0.0,
                           started_at=psutil.Process(victim_rank.pid).create_time())]
            entry = _forge_until_answered(monitor.base, cover.job, victim.job, forged)

            refusal = (f"refused: pid {victim_rank.pid} is rank 0 of job '{victim.job}' here, "
                       f"not of job '{cover.job}' the order names")
            assert victim_rank.poll() is None, f"the other job's rank died: {entry}"
            assert (entry["kind"], entry["outcome"]) == ("signal", "failed"), entry
            assert entry["detail"] == refusal, entry
            deadline = time.monotonic() + 5
            while refusal not in agent.log.read_text(errors="replace") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert refusal in agent.log.read_text(errors="replace"), agent.log_tail()
            assert victim_rank.poll() is None
    finally:
        reaper.close()
        cover.cleanup()
        victim.cleanup()
