"""Two real torchrun jobs on one node, each logging through ``| tee JOB.log``; job A deadlocks
while job B trains on (issue 20).

Watched at once by the session's agent (no ``--log``: no step lines at all, the ranks write a pipe)
and by an agent of this test given both files with ``--log``. Each --log file must count for its
own job only: before, every unprefixed line of a --log file was credited to every job on the node,
so A showed B's steps and stayed healthy while deadlocked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hangwatch.demo.harness import MonitorClient, Reaper, launch_torchrun, start_agent, start_monitor, stop_gently
from tests.e2e.conftest import STALL_STEP, VERDICT_TIMEOUT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _steps(answer: dict) -> dict[int, int | None]:
    return {r["rank"]: r["step"] for r in answer["ranks"]}


def test_each_log_counts_for_its_own_job_and_the_deadlock_is_named_with_and_without_logs(
        reaper: Reaper, tmp_path: Path, client: MonitorClient, wait_for_verdict) -> None:
    job_b = launch_torchrun(reaper, tmp_path, ["--steps", "100000"], name="b", tee=True)
    job_a = launch_torchrun(reaper, tmp_path, ["--fail", "linger", "--fail-at-step", str(STALL_STEP)],
                            name="a", tee=True)
    a_log, b_log = job_a.logs[0], job_b.logs[0]
    logs_dir = tmp_path / "with-logs"
    logs_dir.mkdir()
    monitor = start_monitor(reaper, logs_dir)
    # A is tied through tee's pipe; B is also named, the other way to say which job a file is.
    agent = start_agent(reaper, logs_dir, monitor.url, extra=["--log", str(a_log), "--log", f"{job_b.job_id}={b_log}"])
    job_a.rank_pids(timeout=30)
    job_b.rank_pids(timeout=30)
    # The verdict's time counts from A's stall: two jobs starting at once on a loaded machine took
    # 30 s from their ranks' start to A's first step once (CI), most of the verdict's allowance.
    job_a.wait_for(r"HANGWATCH-STALL t=\S+ mode=linger", timeout=120)
    with_logs = MonitorClient(monitor.url)
    try:
        # With the logs: A's ranks show A's steps only, B's its own, B well past A's stall.
        got = with_logs.wait_for_verdict(job_a.job_id, "deadlock", VERDICT_TIMEOUT, culprits=[1],
                                         context=lambda: job_a.log_tail() + "\nagent:\n" + agent.log_tail(20))
        assert sorted(got["culprit_ranks"]) == [1]
        assert _steps(got)[0] is not None and _steps(got)[0] <= STALL_STEP, _steps(got)
        _wait_for(with_logs, job_b.job_id, lambda b: b.get("verdict") == "healthy"
                  and any((r["step"] or 0) > STALL_STEP + 20 for r in b["ranks"]), "healthy past A's stall")
        again = with_logs.job(job_a.job_id)
        assert max(s or 0 for s in _steps(again).values()) <= STALL_STEP, _steps(again)
        log_tail = agent.log_tail(400)
        # Without them (the session's agent, the same ranks): the deadlock is named all the same. This
        # test's agent stops first: two agents dumping the same ranks on one beat slow both down.
        stop_gently(agent.proc)
        without = wait_for_verdict(job_a, "deadlock", culprits=[1])
        assert sorted(without["culprit_ranks"]) == [1]
        _wait_for(client, job_b.job_id, lambda b: b.get("verdict") == "healthy", "healthy")
    finally:
        with_logs.close()
    assert "credited to job " + job_a.job_id in log_tail, log_tail[-3000:]


def _wait_for(client: MonitorClient, job_id: str, ok, what: str, timeout: float = 60) -> dict:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    answer: dict = {}
    while time.monotonic() < deadline:
        answer = client.job(job_id) or {}
        if answer and ok(answer):
            return answer
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not {what} in {timeout}s: {answer.get('verdict')}, {answer.get('summary')}, "
                         f"steps {_steps(answer) if answer else None}")
