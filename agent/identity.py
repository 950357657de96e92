"""Who a process is in its job: pure rules, from its environment or from what the processes show.

Most launchers put the rank in the environment (first present wins):

- RANK / WORLD_SIZE: torchrun (``launcher`` "torchrun" when TORCHELASTIC_* is set too),
  accelerate, DeepSpeed, any env:// launcher ("env");
- SLURM_PROCID / SLURM_NTASKS: ``srun`` without torchrun ("slurm");
- OMPI_COMM_WORLD_RANK / _SIZE (Open MPI), PMI_RANK / PMI_SIZE (MPICH and Intel MPI's
  hydra), PMIX_RANK with Open MPI's size (PMIx): ``mpirun`` ("mpi").

Two do not, and the process tree says it instead (discovery reads it, these rules decide):

- Lightning's own launcher (``Trainer(strategy="ddp")`` run as ``python train.py``) re-runs
  the user's command for local ranks 1..N-1 with LOCAL_RANK, NODE_RANK, WORLD_SIZE,
  MASTER_ADDR and MASTER_PORT set (lightning/fabric/strategies/launchers/subprocess_script.py);
  local rank 0 is the user's process, their parent, with none of them. Global rank =
  NODE_RANK * processes on the node + LOCAL_RANK.
- ``torch.multiprocessing.spawn`` sets ranks inside Python: its processes are
  ``python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork``
  children of one parent, started in index order: the order of their start times (then
  pids) is the rank. Only taken as ranks with evidence of distributed training (see
  ``spawn_evidence``): a DataLoader's or a Pool's spawned workers look the same otherwise.

Job id, the same on every node of one job, first that applies:

1. TORCHELASTIC_RUN_ID unless "none" (every node of an elastic job shares it);
2. for ranks found by MPI variables, ``pmix:<PMIX_NAMESPACE>`` (mpirun's job namespace,
   shared across nodes);
3. MASTER_ADDR:MASTER_PORT, the rendezvous every rank shares. Before Slurm's ids because a
   torchrun under ``srun`` predicts this form from its argv (agent/launchers.py), and a
   Slurm script that sets MASTER_ADDR/PORT exports the same strings to every node;
4. ``slurm:<SLURM_JOB_ID>.<SLURM_STEP_ID>`` (``slurm:<job>`` outside a step): shared by
   every task of one srun step;
5. ``local:<ppid>`` (``spawn:<ppid>`` for mp.spawn): ranks started by one parent on this
   node; right for single-node jobs without any of the above.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# (rank variable, world size variable, launcher word), first present wins.
RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE", "env"),
    ("SLURM_PROCID", "SLURM_NTASKS", "slurm"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpi"),
    ("PMI_RANK", "PMI_SIZE", "mpi"),
    ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "mpi"),
)
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
# What Lightning's launcher gives its children (rank 0, the parent, has none of them).
LIGHTNING_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Set before mp.spawn (in the shell or the parent's os.environ): WORLD_SIZE says the spawned
# processes are a distributed job; MASTER_PORT says which port their sockets must show.
SPAWN_ENV_EVIDENCE = ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SPAWN_MAIN = "from multiprocessing.spawn import spawn_main"
# Interpreter options that take the next word as their value.
PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "-Q")


@dataclass(frozen=True)
class RankIdentity:
    job_id: str
    rank: int
    world_size: int
    local_rank: int | None
    launcher: str  # "torchrun", "env", "slurm", "mpi", "lightning", "mp.spawn", "accelerate", "deepspeed"
    # How the rank was known: "env:RANK", "env:SLURM_PROCID", "lightning:LOCAL_RANK", ...
    identified_by: str = ""


@dataclass(frozen=True)
class RankProcess:
    pid: int
    ppid: int
    starttime: int
    identity: RankIdentity
    cmdline: str
    env: dict[str, str] = field(default_factory=dict, compare=False)  # the allowlisted part


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def job_id(env: Mapping[str, str], ppid: int, *, mpi: bool = False, fallback: str | None = None) -> str:
    """The job id (see the module docstring for the order and why)."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return run_id[:256]
    if mpi and env.get("PMIX_NAMESPACE"):
        return f"pmix:{env['PMIX_NAMESPACE']}"[:256]
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"[:256]
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")  # the latter: older Slurm
        return (f"slurm:{env['SLURM_JOB_ID']}.{step}" if step else f"slurm:{env['SLURM_JOB_ID']}")[:256]
    return fallback or f"local:{ppid}"


def rank_identity(env: Mapping[str, str], ppid: int) -> RankIdentity | None:
    """Who this process is in its job by its environment alone, or None if it does not say."""
    for rank_var, size_var, launcher in RANK_VARIABLES:
        rank, size = _int(env.get(rank_var)), _int(env.get(size_var))
        if rank is not None and size is not None:
            break
    else:
        return None
    if not (0 <= rank < size):
        return None
    mpi = launcher == "mpi"
    if "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env:
        launcher = "torchrun"
    local_rank = next((v for v in (_int(env.get(k)) for k in LOCAL_RANK_VARIABLES) if v is not None), None)
    return RankIdentity(job_id(env, ppid, mpi=mpi), rank, size, local_rank, launcher, f"env:{rank_var}")


def carries_rank(env: Mapping[str, str]) -> bool:
    """A rank's variables (a rank, or a helper that inherited them)."""
    return any(r in env and s in env for r, s, _ in RANK_VARIABLES)


# --- Lightning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LightningChild:
    local_rank: int
    node_rank: int
    world_size: int
    job_id: str


def lightning_child(env: Mapping[str, str], ppid: int) -> LightningChild | None:
    """A local rank 1..N-1 that Lightning's launcher started, by its environment."""
    if any(r in env for r, _, _ in RANK_VARIABLES) or not all(env.get(k) for k in LIGHTNING_VARIABLES):
        return None
    local, node, size = (_int(env.get(k)) for k in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"))
    if local is None or node is None or size is None or not (1 <= local < size) or node < 0:
        return None
    return LightningChild(local, node, size, job_id(env, ppid))


def python_program(argv: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """(script name or ``-m`` module, its arguments) of a Python command line, else None.

    Interpreter options are skipped: Lightning re-runs ``[sys.executable, abspath(argv[0])]
    + argv[1:]`` (or ``-m module``), dropping them and making the path absolute.
    """
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c", "-"):
        i += 2 if argv[i] in PYTHON_OPTIONS_WITH_VALUE else 1
    if i >= len(argv) or argv[i] in ("-c", "-"):
        return None
    if argv[i] == "-m":
        return (argv[i + 1], tuple(argv[i + 2 :])) if i + 1 < len(argv) else None
    return os.path.basename(argv[i]), tuple(argv[i + 1 :])


def same_program(parent_argv: Sequence[str], child_argv: Sequence[str]) -> bool:
    """The child runs the parent's command again (Hydra appends arguments: a prefix is enough)."""
    parent, child = python_program(parent_argv), python_program(child_argv)
    if parent is None or child is None or parent[0] != child[0]:
        return False
    return child[1][: len(parent[1])] == parent[1]


def lightning_ranks(parent_pid: int, children: Mapping[int, LightningChild]) -> dict[int, RankIdentity]:
    """pid -> identity for one Lightning launch on this node: the children and their parent.

    The processes on this node are the parent (local rank 0) and its children; all children of
    one launch share NODE_RANK, WORLD_SIZE and the master, so the lowest local rank's settle it.
    """
    if not children:
        return {}
    ref = min(children.values(), key=lambda c: c.local_rank)
    ours = {pid: c for pid, c in children.items() if (c.job_id, c.node_rank, c.world_size) ==
            (ref.job_id, ref.node_rank, ref.world_size)}
    first = ref.node_rank * (len(ours) + 1)

    def identity(local: int, how: str) -> RankIdentity:
        return RankIdentity(ref.job_id, first + local, ref.world_size, local, "lightning", how)

    out = {parent_pid: identity(0, "lightning:parent-of-LOCAL_RANK-children")}
    out.update((pid, identity(c.local_rank, "lightning:LOCAL_RANK")) for pid, c in ours.items())
    return {pid: ident for pid, ident in out.items() if ident.rank < ident.world_size}


# --- torch.multiprocessing.spawn -------------------------------------------------------------


def is_spawn_child(argv: Sequence[str]) -> bool:
    """``python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork``."""
    return (
        len(argv) >= 3 and argv[-1] == "--multiprocessing-fork"
        and any(a.startswith(SPAWN_MAIN) for a in argv[1:-1])
    )


def maps_torch(maps_text: str) -> bool:
    """/proc/PID/maps text with libtorch loaded."""
    return "/libtorch" in maps_text


def spawn_env_evidence(envs: Iterable[Mapping[str, str]]) -> bool:
    """WORLD_SIZE set for the children: a process group, whatever their sockets show yet.
    MASTER_ADDR/PORT alone is not enough (job templates export them for every job); they
    only say which port the sockets must reach (``spawn_socket_evidence``)."""
    return any("WORLD_SIZE" in env for env in envs)


def _port(endpoint: str) -> int | None:
    return _int(endpoint.rpartition(":")[2])


def spawn_socket_evidence(sockets: Mapping[int, Iterable], master_port: int | None = None) -> bool:
    """Sockets (pid -> agent.sockets.TcpEntry) that show a process group among the children.

    Either one child connects to a port another (or it) listens on: torch's TCPStore in rank
    0, or gloo's pair connections; or, with MASTER_PORT known from the environment, a child
    listens on it or reaches it (the store of a master on another node). Many children
    reaching one remote port is not enough on its own: spawned data workers all reach the
    same Redis or object store.
    """
    entries = [(pid, e) for pid, es in sockets.items() for e in es]
    listening = {e.local_port for _, e in entries if e.state == "LISTEN"}
    if master_port is not None and master_port in listening:
        return True
    for _, e in entries:
        if e.state not in ("ESTABLISHED", "SYN_SENT"):
            continue
        port = _port(e.remote)
        if port in listening or (master_port is not None and port == master_port):
            return True
    return False


def spawn_ranks(parent_pid: int, children: Iterable[tuple[int, int]], env: Mapping[str, str]) -> dict[int, RankIdentity]:
    """pid -> identity for the processes one mp.spawn started: ``children`` as (starttime, pid),
    every one it started that was seen (ended ones too: the order must not shift).

    ``env``: what the children's (or the parent's) environment says: WORLD_SIZE, NODE_RANK,
    MASTER_ADDR/PORT when they were set before the spawn.
    """
    ordered = sorted(children)
    node = _int(env.get("NODE_RANK")) or 0
    size = _int(env.get("WORLD_SIZE")) or len(ordered)
    job = job_id({k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in env}, parent_pid,
                 fallback=f"spawn:{parent_pid}")
    out = {}
    for index, (_, pid) in enumerate(ordered):
        rank = node * len(ordered) + index
        if rank < size:
            out[pid] = RankIdentity(job, rank, size, index, "mp.spawn", "mp.spawn:start-order")
    return out
