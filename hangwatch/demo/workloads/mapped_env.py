"""train.py as a rank of a launcher that does not set RANK: srun, mpirun (Open MPI, MPICH).

What an sbatch or mpirun script commonly does: the rank program itself maps the launcher's
variables to the ones ``init_process_group("gloo")`` reads (env://). Set here, inside
Python, they never show in /proc/PID/environ: the agent must find the rank from the
launcher's own variables. MASTER_ADDR/MASTER_PORT come from the launch environment; under
Slurm without them, from Slurm's variables as Lightning's SLURMEnvironment derives them
(port 15000 + the job id's last 4 digits; the address of the node srun ran on).

    srun -n 2 python mapped_env.py --fail linger        (SLURM_PROCID / SLURM_NTASKS)
    mpirun -np 2 python mapped_env.py --fail linger     (OMPI_COMM_WORLD_RANK / _SIZE)
"""

from __future__ import annotations

import os
import sys

# (rank, world size, local rank) variables of each launcher, first present wins.
LAUNCHER_VARIABLES = (
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)


def map_launcher_env(env: dict[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE and LOCAL_RANK from the first launcher whose variables are set."""
    for rank, size, local in LAUNCHER_VARIABLES:
        if rank in env and size in env:
            return {"RANK": env[rank], "WORLD_SIZE": env[size], "LOCAL_RANK": env.get(local, env[rank])}
    raise SystemExit("mapped_env.py: no SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK in the environment")


def slurm_master(env: dict[str, str]) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT from Slurm's variables, when the launch did not set them."""
    if "MASTER_PORT" in env or "SLURM_JOB_ID" not in env:
        return {}
    return {"MASTER_ADDR": env.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"),
            "MASTER_PORT": str(15000 + int(env["SLURM_JOB_ID"][-4:]))}


def main() -> int:
    os.environ.update(map_launcher_env(dict(os.environ)))
    os.environ.update(slurm_master(dict(os.environ)))
    from hangwatch.demo.workloads import train

    train.leave(train.main(sys.argv[1:]))  # never returns: see train.leave
    return 0


if __name__ == "__main__":
    sys.exit(main())
