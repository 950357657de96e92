"""Start training jobs under launchers other than torchrun, for the end-to-end tests.

- ``launch_lightning``: ``python lightning_train.py`` (Lightning's own launcher starts the
  other local ranks); the job id is the master its children carry, found once they exist;
- ``launch_spawn``: ``torch.multiprocessing.spawn`` (job id ``spawn:<parent pid>``);
- ``launch_srun_style``: what ``srun`` does for one step, without Slurm: a shell script starts
  the tasks with SLURM_PROCID/SLURM_NTASKS/SLURM_JOB_ID/SLURM_STEP_ID (and, like an sbatch
  script, MASTER_ADDR/MASTER_PORT) and waits;
- ``launch_mpirun``: a real ``mpirun -np N`` (Open MPI); job id ``pmix:<PMIX_NAMESPACE>``
  read from a rank, else the master.

The rank programs map their launcher's variables to RANK/WORLD_SIZE inside Python
(hangwatch/demo/workloads/mapped_env.py), so /proc/PID/environ never has RANK. Every process
is recorded in the Reaper (launchers with ``launcher=True``: their children are killed by
pid with them).
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

import hangwatch.demo.workloads
from hangwatch.demo.harness import LOOPBACK, Job, Reaper, _nice, _workload_env, free_port

WORKLOADS = Path(hangwatch.demo.workloads.__file__).resolve().parent
LIGHTNING_SCRIPT = WORKLOADS / "lightning_train.py"
SPAWN_SCRIPT = WORKLOADS / "spawn_train.py"
MAPPED_SCRIPT = WORKLOADS / "mapped_env.py"
# mpirun refuses to run as root without both of these (Open MPI 4 and 5).
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _start(reaper: Reaper, workdir: Path, name: str, cmd: Sequence[str], env: dict[str, str],
           job_id: str, kind: str, nproc: int) -> Job:
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        p = reaper.popen(list(cmd), launcher=True, stdout=out, stderr=subprocess.STDOUT, env=env,
                         preexec_fn=_nice, cwd=workdir)
    job = Job(job_id=job_id, kind=kind, logs=[log], launcher=p, reaper=reaper)
    job.nproc = nproc
    return job


def ranks_under(job: Job, has_rank: Callable[[dict[str, str], list[str]], bool], count: int,
                timeout: float = 60.0) -> list[psutil.Process]:
    """The processes under the job's launcher that ``has_rank(environ, cmdline)``, once there are
    ``count``; each adopted by the reaper at once."""
    end = time.monotonic() + timeout
    while True:
        found = []
        try:
            children = psutil.Process(job.launcher.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            if job.reaper:
                job.reaper.adopt(child.pid)
            try:
                if has_rank(child.environ(), child.cmdline()):
                    found.append(child)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if len(found) >= count:
            return found
        if time.monotonic() > end or job.launcher.poll() is not None:
            raise AssertionError(f"{len(found)} of {count} ranks under pid {job.launcher.pid}:\n{job.log_tail()}")
        time.sleep(0.1)


def launch_lightning(reaper: Reaper, workdir: Path, train_args: Sequence[str], *, devices: int = 2,
                     name: str = "lightning") -> Job:
    """``python lightning_train.py --devices N ...``; ``job_id`` is set once the children exist
    (Lightning picks a free MASTER_PORT itself)."""
    cmd = [sys.executable, str(LIGHTNING_SCRIPT), "--devices", str(devices), *train_args]
    job = _start(reaper, workdir, name, cmd, _workload_env(), "", "lightning", devices)
    children = ranks_under(job, lambda env, _: "LOCAL_RANK" in env and "MASTER_PORT" in env, devices - 1)
    env = children[0].environ()
    job.job_id = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return job


def launch_spawn(reaper: Reaper, workdir: Path, train_args: Sequence[str], *, nprocs: int = 2,
                 name: str = "spawn") -> Job:
    cmd = [sys.executable, str(SPAWN_SCRIPT), "--nprocs", str(nprocs), "--port", str(free_port()),
           "--", *train_args]
    job = _start(reaper, workdir, name, cmd, _workload_env(), "", "spawn", nprocs)
    job.job_id = f"spawn:{job.launcher.pid}"
    return job


def launch_srun_style(reaper: Reaper, workdir: Path, train_args: Sequence[str], *, ntasks: int = 2,
                      export_master: bool = True, step: str = "0", name: str = "srun") -> Job:
    """A shell script in place of ``srun -n N python mapped_env.py ...`` in an sbatch script.

    ``export_master``: the script exports MASTER_ADDR/MASTER_PORT (job id: the master, see
    agent/identity.py's order); else the ranks derive them from SLURM_JOB_ID inside Python
    (job id ``slurm:<job>.<step>``), the job id chosen so that its port is free.
    """
    slurm_job = str(10000 + free_port_between(15000, 25000) - 15000)
    port = free_port() if export_master else 15000 + int(slurm_job[-4:])
    script = workdir / f"{name}-launch.sh"
    rank_cmd = " ".join(shlex.quote(a) for a in [sys.executable, str(MAPPED_SCRIPT), *train_args])
    master = f"export MASTER_ADDR={LOOPBACK} MASTER_PORT={port}\n" if export_master else ""
    script.write_text(
        "#!/bin/bash\n"
        "# One srun step: every task with Slurm's variables, then wait for them all.\n"
        f"export SLURM_JOB_ID={slurm_job} SLURM_STEP_ID={step} SLURM_NTASKS={ntasks} SLURM_NNODES=1 SLURM_NODEID=0\n"
        f"export SLURM_JOB_NAME={name}-job\n"
        f"export SLURM_LAUNCH_NODE_IPADDR={LOOPBACK}\n"
        f"{master}"
        f"for task in $(seq 0 {ntasks - 1}); do\n"
        f"    SLURM_PROCID=$task SLURM_LOCALID=$task {rank_cmd} &\n"
        "done\n"
        "wait\n"
    )
    env = {k: v for k, v in _workload_env().items() if not k.startswith("SLURM_")}
    job_id = f"{LOOPBACK}:{port}" if export_master else f"slurm:{slurm_job}.{step}"
    job = _start(reaper, workdir, name, ["bash", str(script)], env, job_id, "srun", ntasks)
    ranks_under(job, lambda env, _: "SLURM_PROCID" in env, ntasks)
    return job


def free_port_between(low: int, high: int, tries: int = 50) -> int:
    """A port in [low, high) nobody listens on now (random: parallel tests rarely collide)."""
    for _ in range(tries):
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{low}, {high})")


def mpirun() -> str | None:
    return shutil.which("mpirun")


def launch_mpirun(reaper: Reaper, workdir: Path, train_args: Sequence[str], *, np: int = 2,
                  name: str = "mpirun") -> Job:
    """``mpirun -np N python mapped_env.py ...`` with MASTER_ADDR/MASTER_PORT in its environment
    (local ranks inherit it); job id from a rank's PMIX_NAMESPACE, else the master."""
    port = free_port()
    cmd = [mpirun() or "mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(MAPPED_SCRIPT), *train_args]
    env = _workload_env({"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), **MPI_ROOT_ENV})
    job = _start(reaper, workdir, name, cmd, env, "", "mpirun", np)
    ranks = ranks_under(job, lambda env, _: "OMPI_COMM_WORLD_RANK" in env, np)
    namespace = ranks[0].environ().get("PMIX_NAMESPACE")
    job.job_id = f"pmix:{namespace}" if namespace else f"{LOOPBACK}:{port}"
    return job
