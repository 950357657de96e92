"""Issue 32 on real 2-rank gloo jobs: what the ranks do outranks what the job prints.

Three job shapes whose log says nothing useful about the hang, each diagnosed from the ranks'
own state (CPU, bytes, stacks, the file a rank is blocked on) by the real agent and monitor:
a side thread's counter that keeps rising through a deadlock, a job that logs every 100th step,
and a checkpoint save whose open never returns.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import STALL_STEP

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def evidence(job: dict) -> str:
    return "\n".join(job["evidence"])


def test_a_side_threads_counter_does_not_hide_a_deadlock(plain_job, wait_for_verdict):
    """Every rank prints "[hb] rank R beat N uptime Ts" twice a second from a thread of its own; rank 1
    leaves the loop and sleeps, rank 0 waits in all_reduce. The counter rises to the end (the agent
    reads it as steps), and the deadlock is named all the same, the counter said to be discounted.
    (This is also the suite's plain linger deadlock: the counter on top costs no second job. Its ranks
    run outside pods and Slurm, so the job has no other name than its id: tests/e2e/test_job_names.py
    has a job in a pod.)"""
    job = plain_job("--heartbeat-every", "0.5", "--fail", "linger", "--fail-at-step", str(STALL_STEP))
    got = wait_for_verdict(job, "deadlock", culprits=[1])
    waiting = next(r for r in got["ranks"] if r["rank"] == 0)
    assert waiting["state"] == "in_collective" and waiting["top_frame"].startswith("all_reduce"), waiting
    # Which clock names it is not asserted: where the agent read no beat as progress after the stall
    # (seen once on a loaded CI machine), the log's own silence names it first. Either way the counter
    # did not keep the job "healthy", which is what it did before (a timeout here).
    # The counter kept going after the stall (rank 0's last step line): the log alone said the job was alive.
    after = job.logs[0].read_text().rsplit("\nstep ", 1)[1]
    assert len(re.findall(r"\[hb\] rank 0 beat \d+", after)) >= 4, job.log_tail()
    # No pod, no Slurm job: no other name (HOSTNAME alone names no pod).
    assert "display" not in got["names"] and "k8s_pods" not in got["names"], got["names"]
    assert {r["k8s_pod"] for r in got["ranks"]} == {None}


def test_a_job_that_logs_every_100_steps_is_judged_by_its_ranks(plain_job, wait_for_verdict):
    """The step line comes every 100th step only (Megatron-LM's --log-interval); rank 1 stalls 50
    steps after a line. The log's own pace would wait some 5 lines' worth (35 s and more here); the
    stacks and CPU name the deadlock while the log is still within its pace."""
    job = plain_job("--log-every", "100", "--step-sleep", "0.03", "--fail", "linger", "--fail-at-step", "350")
    job.wait_for_step(300, timeout=90)
    assert "step 350/" not in job.text() and "step 250/" not in job.text()  # the log shows every 100th step only
    got = wait_for_verdict(job, "deadlock", culprits=[1], timeout=60)
    assert "held in all_reduce@" in evidence(got), evidence(got)
    silent, usual = (float(x) for x in re.search(
        r"no progress for ([0-9.]+)s \(progress usually seen every ([0-9.]+)s\)", evidence(got)).groups())
    # Named before the log's own clock would (it waits MEDIAN_FACTOR=5 times the usual gap).
    assert silent < 5 * usual, evidence(got)


def test_a_save_whose_open_never_returns_is_named_stuck_io_with_its_file(plain_job, wait_for_verdict, tmp_path,
                                                                        client):
    """Rank 0's torch.save opens a path that never answers (a FIFO nobody reads, as a hung network
    mount); rank 1 waits at the barrier after it. A save keeps its grace while it writes; this one
    writes nothing at 0% CPU, so it is named stuck I/O, with the file, well before the 2-minute grace."""
    job = plain_job("--fail", "stuck-save", "--fail-rank", "0", "--checkpoint-dir", str(tmp_path),
                       "--fail-at-step", str(STALL_STEP))
    observations: list = []
    got = wait_for_verdict(job, "deadlock", culprits=[0], timeout=90, observations=observations)
    fifo = next(tmp_path.glob("hangwatch-hung-ckpt-*.pt"))
    assert "rank 0 is stuck in I/O (openat " in got["summary"] and str(fifo) in got["summary"], got["summary"]
    assert f"blocked in openat on {fifo}" in evidence(got), evidence(got)
    assert "torch/serialization.py" in evidence(got) or "save" in evidence(got), evidence(got)
    assert any("filesystem" in h for h in got["hints"]), got["hints"]
    # Until then the save had its grace: no other alarm was raised on the way.
    assert {o.verdict for o in observations} <= {"healthy", "deadlock", None}, observations
