"""Every verdict on a real 2-rank gloo job, diagnosed by the real agent and a real monitor.

Each test starts the workload (hangwatch/demo/workloads/train.py) so that it goes wrong in one way
at step STALL_STEP (or from outside: SIGKILL / SIGSTOP), then polls ``/diagnose?format=json``
until the expected verdict and culprit ranks show up.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from hangwatch.demo.harness import Observation
from tests.e2e.conftest import STALL_STEP, VERDICT_TIMEOUT
from tests.e2e.test_cli import run as run_cli
from tests.e2e.test_cli import run_on_tty as run_cli_on_tty

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

FAIL_AT = ("--fail-at-step", str(STALL_STEP))


def culprits(job: dict) -> list[int]:
    return sorted(job["culprit_ranks"])


def evidence(job: dict) -> str:
    return "\n".join(job["evidence"])


def test_rank_exits_early_under_torchrun(torchrun_job, wait_for_verdict):
    job = torchrun_job("--fail", "exit", *FAIL_AT)
    # rank 0's peer error reaches the monitor a report or two after rank 1's end (later still on a
    # loaded machine): wait for it rather than take the first rank_exited answer.
    got = wait_for_verdict(job, "rank_exited", culprits=[1], where=lambda j: _peer_error_shown(evidence(j)))
    assert got["verdict"] == "rank_exited"
    assert culprits(got) == [1]
    # torchrun's own summary blames rank 0; the evidence shows rank 1's end and the peer error
    # on rank 0 that followed it. Rank 1's status is read from its zombie, a race against
    # torchrun's 0.1-s reaping that a loaded agent can lose (it then says "exit status
    # unknown"), and torchrun logs no status for a clean exit: the status, when known, is 0.
    rank1 = next(line for line in got["evidence"] if line.startswith("rank 1 "))
    assert "exited with code 0" in rank1 or "ended (exit status unknown)" in rank1, rank1
    assert _peer_error_shown(evidence(got))


def _peer_error_shown(text: str) -> bool:
    return "Connection closed by peer" in text or "Connection reset by peer" in text


def test_rank_exits_early_under_plain_launch(plain_job, wait_for_verdict):
    job = plain_job("--fail", "exit", *FAIL_AT)
    got = wait_for_verdict(job, "rank_exited", culprits=[1])
    assert culprits(got) == [1]


@pytest.mark.parametrize("log_format", ["mmengine", "json", "hf"])
def test_a_log_format_no_pattern_knows_is_learned_and_the_deadlock_named(plain_job, wait_for_verdict, client,
                                                                        log_format):
    """The workload logs its steps as mmengine or a JSON-lines logger does, or only its loss as
    transformers' Trainer does (no step number: a heartbeat): the agent learns where the step is,
    or the pace (agent/progress_learner.py), the monitor shows what it learned, and the deadlock
    is named. (The workload's own "left the loop at step N" line, printed when it stalls, is read
    by the generic pattern: the learned steps are checked while the job still steps.)"""
    job = plain_job("--log-format", log_format, "--fail", "linger", "--fail-at-step", "150")
    deadline = time.monotonic() + 45
    learned = None
    while learned is None and time.monotonic() < deadline and "mode=linger" not in job.text():
        answer = client.job(job.job_id) or {}
        learned = next((r for r in answer.get("ranks", [])
                        if (r.get("progress_pattern") or "").startswith("learned") and r["step"]), None)
        time.sleep(0.3)
    assert learned is not None, f"no learned progress before the stall:\n{job.log_tail()}"
    kind = {"mmengine": "counter", "json": "json", "hf": "heartbeat"}[log_format]
    assert learned["progress_pattern"].startswith(f"learned ({kind}, "), learned
    assert 0 < learned["step"] < 150
    if log_format == "mmengine":
        assert "Iter(train) [" in learned["progress_pattern"], learned
    got = wait_for_verdict(job, "deadlock", culprits=[1])
    assert culprits(got) == [1]
    assert "no progress line seen yet" not in evidence(got), evidence(got)


def test_a_job_that_logs_to_a_file_of_its_own_shows_its_steps_and_its_deadlock_is_named(
        plain_job, wait_for_verdict, client, tmp_path):
    """Rank 0 logs its steps through logging.FileHandler to a file only it holds open (stdout
    gets no step line): the agent, given no --log, follows the file because the rank appends to it
    (agent/appended_files.py), the monitor shows rank 0 stepping, and the deadlock is named."""
    own_log = tmp_path / "rank0-own.log"
    job = plain_job("--log-file", str(own_log), "--fail", "linger", "--fail-at-step", "150")
    deadline = time.monotonic() + 45
    stepping = None
    while stepping is None and time.monotonic() < deadline and "mode=linger" not in job.text():
        answer = client.job(job.job_id) or {}
        stepping = next((r for r in answer.get("ranks", []) if r["rank"] == 0 and (r["step"] or 0) > 0), None)
        time.sleep(0.3)
    assert stepping is not None, f"rank 0's steps never shown before the stall:\n{job.log_tail()}"
    assert 0 < stepping["step"] < 150 and not stepping["progress_pattern"].startswith("learned"), stepping
    assert "step " in own_log.read_text() and "| loss" not in job.text()  # the steps are in its file only
    got = wait_for_verdict(job, "deadlock", culprits=[1])
    assert culprits(got) == [1]


# The plain linger deadlock (rank 1 leaves the loop and sleeps, rank 0 waits in all_reduce) is run
# with a side thread's counter on top in tests/e2e/test_ranks_outrank_logs.py: the same verdict,
# ranks and frames, from one job instead of two.


def test_rank0_only_extra_collective(plain_job, wait_for_verdict):
    job = plain_job("--fail", "extra-collective", "--fail-rank", "0", *FAIL_AT)
    got = wait_for_verdict(job, "deadlock", culprits=[0])
    assert culprits(got) == [0]


def test_ddp_rank_lingers(plain_job, wait_for_verdict):
    job = plain_job("--ddp", "--fail", "linger", *FAIL_AT)
    got = wait_for_verdict(job, "deadlock", culprits=[1])
    assert culprits(got) == [1]


def test_async_allreduce_rank_lingers(plain_job, wait_for_verdict):
    job = plain_job("--async-allreduce", "--fail", "linger", *FAIL_AT)
    got = wait_for_verdict(job, "deadlock", culprits=[1])
    assert culprits(got) == [1]


def test_sigstop_then_sigkill_rank1(torchrun_job, wait_for_verdict, reaper):
    """Rank 1 stopped (SIGSTOP: the others wait for it), then killed while stopped, as a person at
    the keyboard ends it: rank_stopped, then rank_exited with the signal, each naming rank 1. One
    job for both (each verdict had a job of its own)."""
    job = torchrun_job("--steps", "100000")
    pids = job.rank_pids()
    job.wait_for_step(STALL_STEP)
    reaper.kill(pids[1], signal.SIGSTOP)
    try:
        got = wait_for_verdict(job, "rank_stopped", culprits=[1])
        assert culprits(got) == [1]
    finally:
        reaper.kill(pids[1], signal.SIGKILL)  # a stopped process dies of SIGKILL as it is
    got = wait_for_verdict(job, "rank_exited", culprits=[1])
    assert culprits(got) == [1]
    assert "killed by SIGKILL" in evidence(got)


@pytest.mark.cpu_bound
def test_straggler_rank1(plain_job, wait_for_verdict):
    job = plain_job("--fail", "straggle", "--busy-seconds", "60", *FAIL_AT)
    got = wait_for_verdict(job, "straggler", culprits=[1])
    assert culprits(got) == [1]
    straggler = next(r for r in got["ranks"] if r["rank"] == 1)
    assert straggler["state"] == "computing" and "busy_compute" in (straggler["top_frame"] or "")


@pytest.mark.cpu_bound
def test_a_rank_spinning_while_its_peer_waits_is_named_in_a_job_that_logs_no_steps(plain_job, wait_for_verdict):
    """No step line at all (--log-format none): the verdict does not hinge on the log. Rank 1
    computes for 60 s before its next all_reduce while rank 0 waits there: a straggler, as in a
    job that logs its steps, named once rank 0 has sat parked past the no-pace allowance."""
    job = plain_job("--log-format", "none", "--fail", "straggle", "--busy-seconds", "60", *FAIL_AT)
    got = wait_for_verdict(job, "straggler", culprits=[1])
    assert culprits(got) == [1]
    spinning = next(r for r in got["ranks"] if r["rank"] == 1)
    assert spinning["state"] == "computing" and "busy_compute" in (spinning["top_frame"] or ""), spinning


@pytest.mark.cpu_bound
def test_all_ranks_busy_is_slow_compute(plain_job, wait_for_verdict):
    job = plain_job("--fail", "busy-all", "--busy-seconds", "60", *FAIL_AT)
    got = wait_for_verdict(job, "slow_compute")
    assert got["verdict"] == "slow_compute"


def test_world_size_never_reached(plain_job, wait_for_verdict):
    job = plain_job("--steps", "100", world_size=3, nranks=2)
    got = wait_for_verdict(job, "rendezvous_hang")
    assert got["verdict"] == "rendezvous_hang"
    # Say what the ranks wait for.
    text = " ".join([got.get("summary", "")] + list(got.get("evidence", [])) + list(got.get("hints", [])))
    assert "3" in text, text


def test_clean_finish(torchrun_job, wait_for_verdict):
    job = torchrun_job("--steps", "80")
    got = wait_for_verdict(job, "finished", culprits=[])
    assert culprits(got) == []
    assert job.launcher.wait(timeout=30) == 0


def test_no_alarm_before_the_stall(plain_job, wait_for_verdict, client, monitor):
    """While the job is healthy every answer is ``healthy``; the deadlock shows after the stall.
    ``hangwatch diagnose`` and ``status`` asked at both ends exit as the verdict says (0 healthy,
    1 an alarm, 3 no such job): the same job, the commands' exit codes on a real hang."""
    stall_step = 200  # ~12 s of healthy steps at ~0.06 s/step
    job = plain_job("--fail", "linger", "--fail-at-step", str(stall_step))
    seen: list[Observation] = []
    job.wait_for_step(20, timeout=VERDICT_TIMEOUT)
    got = wait_for_verdict(job, "healthy", observations=seen)
    assert got["verdict"] == "healthy"
    res = run_cli("diagnose", "--monitor", monitor.url, "--job", job.job_id)
    assert res.returncode == 0, res
    assert job.job_id in res.stdout and "HEALTHY" in res.stdout.upper()
    # Keep watching until the stall starts.
    while job.stall_time() is None:
        assert not job.finished(), job.log_tail()
        job_now = client.job(job.job_id)
        seen.append(Observation(time.time(), job_now and job_now["verdict"],
                                tuple(job_now["culprit_ranks"]) if job_now else ()))
        time.sleep(0.25)
    stall = job.stall_time()
    before = [o for o in seen if o.at < stall and o.verdict is not None]
    wrong = [o for o in before if o.verdict != "healthy"]
    assert before, "the monitor never answered for the job before the stall"
    assert not wrong, f"alarm before the stall (t={stall:.1f}): {wrong}"
    # The monitor's own verdict history must not hold an alarm before the stall either.
    history = client.history(job.job_id) or []
    early = [h for h in history if h["at"] < stall - 1.0 and h["verdict"] not in ("healthy",)]
    assert not early, f"verdict history has an alarm before the stall: {early}"
    wait_for_verdict(job, "deadlock", culprits=[1])
    _commands_say_deadlock(monitor.url, job.job_id)


def _commands_say_deadlock(monitor: str, job_id: str) -> None:
    res = run_cli("diagnose", "--monitor", monitor, "--job", job_id)
    assert res.returncode == 1, res
    assert "DEADLOCK" in res.stdout.upper()
    res = run_cli("diagnose", "--monitor", monitor, "--job", job_id, "--json")
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert [j["verdict"] for j in data["jobs"]] == ["deadlock"]
    assert data["jobs"][0]["culprit_ranks"] == [1]
    res = run_cli("status", "--monitor", monitor, "--job", job_id)
    assert res.returncode == 1
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].split()[:2] == ["JOB", "VERDICT"], lines
    assert lines[1].split()[:2] == [job_id, "DEADLOCK"] and "1@" in lines[1], lines
    # Plain when piped, coloured on a terminal.
    assert "\033[" not in res.stdout
    for cmd in ("status", "diagnose"):
        code, shown = run_cli_on_tty(cmd, "--monitor", monitor, "--job", job_id)
        assert code == 1 and "\033[1;31mDEADLOCK" in shown, shown
    res = run_cli("diagnose", "--monitor", monitor, "--job", "no-such-job:1")
    assert res.returncode == 3 and "no job" in res.stderr
