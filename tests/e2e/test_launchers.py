"""Jobs started by launchers other than torchrun, found by the real agent and diagnosed by a real
monitor: Lightning's own launcher, torch.multiprocessing.spawn, srun-style tasks and mpirun.

In each, rank 1 stops calling collectives at step STALL_STEP (it sleeps forever) while rank 0
waits in the all-reduce: a deadlock with rank 1 as the culprit. None of these ranks has RANK in
its environment: the agent must say how it knew each one (``identified_by``).
"""

from __future__ import annotations

import re

import pytest

from hangwatch.demo.other_launchers import launch_lightning, launch_mpirun, launch_spawn, launch_srun_style, mpirun
from tests.e2e.conftest import STALL_STEP

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LINGER = ("--fail", "linger", "--fail-at-step", str(STALL_STEP))
# Start-up of two Lightning (or mp.spawn) processes on 2 cores is slower than torchrun's.
TIMEOUT = 90.0


def _by_rank(job: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in job["ranks"]}


def test_lightning_ddp_rank_lingers(reaper, tmp_path, agent, wait_for_verdict):
    job = launch_lightning(reaper, tmp_path, LINGER)
    got = wait_for_verdict(job, "deadlock", TIMEOUT, culprits=[1])
    ranks = _by_rank(got)
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["pid"] == job.launcher.pid  # rank 0 is the user's own process
    assert ranks[0]["identified_by"] == "lightning:parent-of-LOCAL_RANK-children"
    assert ranks[1]["identified_by"] == "lightning:LOCAL_RANK"
    assert {r["launcher"] for r in ranks.values()} == {"lightning"}


def test_mp_spawn_rank_lingers(reaper, tmp_path, agent, wait_for_verdict):
    job = launch_spawn(reaper, tmp_path, LINGER)
    got = wait_for_verdict(job, "deadlock", TIMEOUT, culprits=[1])
    ranks = _by_rank(got)
    assert sorted(ranks) == [0, 1]
    assert job.launcher.pid not in {r["pid"] for r in ranks.values()}  # the parent only waits
    assert {(r["launcher"], r["identified_by"]) for r in ranks.values()} == {("mp.spawn", "mp.spawn:start-order")}


@pytest.mark.parametrize("export_master", [True, False], ids=["sbatch-exports-master", "master-from-slurm-ids"])
def test_srun_style_tasks_rank_lingers(reaper, tmp_path, agent, wait_for_verdict, export_master):
    job = launch_srun_style(reaper, tmp_path, LINGER, export_master=export_master)
    # With the master exported, its address and port name the job; else Slurm's job and step.
    assert job.job_id.startswith("127.0.0.1:" if export_master else "slurm:1")
    got = wait_for_verdict(job, "deadlock", TIMEOUT, culprits=[1])
    assert got["job_id"] == job.job_id and (export_master or got["job_id"].endswith(".0"))
    ranks = _by_rank(got)
    assert sorted(ranks) == [0, 1]
    assert {(r["launcher"], r["identified_by"]) for r in ranks.values()} == {("slurm", "env:SLURM_PROCID")}
    # Whatever the job id, people know it by its Slurm job and step.
    slurm_job = re.search(r"SLURM_JOB_ID=(\d+)", (tmp_path / "srun-launch.sh").read_text()).group(1)
    assert got["names"]["slurm_job"] == f"{slurm_job}.0"
    assert got["names"]["display"] == f"slurm job {slurm_job}.0 (srun-job)"


@pytest.mark.skipif(mpirun() is None, reason="no mpirun (scripts/system-deps.sh installs openmpi-bin)")
def test_mpirun_rank_lingers(reaper, tmp_path, agent, wait_for_verdict):
    job = launch_mpirun(reaper, tmp_path, LINGER)
    assert job.job_id.startswith("pmix:")  # Open MPI gives every rank its job's PMIx namespace
    got = wait_for_verdict(job, "deadlock", TIMEOUT, culprits=[1])
    assert got["job_id"] == job.job_id
    ranks = _by_rank(got)
    assert sorted(ranks) == [0, 1]
    assert {(r["launcher"], r["identified_by"]) for r in ranks.values()} == {("mpi", "env:OMPI_COMM_WORLD_RANK")}
