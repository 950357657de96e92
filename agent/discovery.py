"""Find the training ranks on this node from /proc.

A rank is a Python process whose environment names its rank and world size
(torchrun/env://, SLURM or Open MPI variables). Launchers, this agent and its
children (py-spy), and helper processes that inherit a rank's environment
(DataLoader and compile workers) are left out.

Job identity: TORCHELASTIC_RUN_ID when set and not "none" (shared by every node
of an elastic job), else MASTER_ADDR:MASTER_PORT (the rendezvous all ranks share),
else SLURM_JOB_ID, else "local:<ppid>" -- ranks started by one parent process on
this node; good enough for a single-node job with none of the usual variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from agent.procstat import Stat, read_stat

LAUNCHER_SCRIPTS = ("torchrun",)
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
ANCESTOR_LEVELS = 6

# (rank variable, world size variable, launcher word), first present wins.
RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE", "env"),
    ("SLURM_PROCID", "SLURM_NTASKS", "slurm"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpi"),
)
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


@dataclass(frozen=True)
class RankIdentity:
    job_id: str
    rank: int
    world_size: int
    local_rank: int | None
    launcher: str


@dataclass(frozen=True)
class RankProcess:
    pid: int
    ppid: int
    starttime: int
    identity: RankIdentity
    cmdline: str


def parse_environ(data: bytes) -> dict[str, str]:
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def rank_identity(env: dict[str, str], ppid: int) -> RankIdentity | None:
    """Who this process is in its job, or None if it is not a rank."""
    for rank_var, size_var, launcher in RANK_VARIABLES:
        rank, size = _int(env.get(rank_var)), _int(env.get(size_var))
        if rank is not None and size is not None:
            break
    else:
        return None
    if not (0 <= rank < size):
        return None
    if "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env:
        launcher = "torchrun"
    local_rank = next(
        (v for v in (_int(env.get(k)) for k in LOCAL_RANK_VARIABLES) if v is not None), None
    )
    return RankIdentity(job_id(env, ppid), rank, size, local_rank, launcher)


def job_id(env: dict[str, str], ppid: int) -> str:
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return run_id[:256]
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"[:256]
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}"
    return f"local:{ppid}"


def parse_cmdline(data: bytes) -> list[str]:
    return [a.decode("utf-8", "replace") for a in data.rstrip(b"\0").split(b"\0") if a]


def is_python(exe: str, argv: list[str]) -> bool:
    names = [os.path.basename(exe)] + ([os.path.basename(argv[0])] if argv else [])
    return any(n.startswith("python") for n in names)


def is_launcher(argv: list[str]) -> bool:
    # Whole words only: a training script under a directory named "torchrun_tests" is a rank.
    return any(
        os.path.basename(arg) in LAUNCHER_SCRIPTS or arg in LAUNCHER_MODULES for arg in argv
    )


def drop_helpers(candidates: dict[int, RankProcess], parents: dict[int, int]) -> list[RankProcess]:
    """Keep the ranks themselves, not their children that inherited the environment.

    A candidate is a helper when one of its ancestors is a candidate of the same
    job and rank. Pure: ``parents`` maps pid -> ppid for every process seen.
    """
    kept = []
    for proc in candidates.values():
        pid, helper = proc.pid, False
        for _ in range(ANCESTOR_LEVELS):
            pid = parents.get(pid, 0)
            if pid <= 1:
                break
            other = candidates.get(pid)
            if other and (other.identity.job_id, other.identity.rank) == (
                proc.identity.job_id,
                proc.identity.rank,
            ):
                helper = True
                break
        if not helper:
            kept.append(proc)
    return sorted(kept, key=lambda p: (p.identity.job_id, p.identity.rank, p.pid))


def _descends_from(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    for _ in range(ANCESTOR_LEVELS * 2):
        if pid == ancestor:
            return True
        pid = parents.get(pid, 0)
        if pid <= 1:
            return False
    return False


@dataclass
class Discovery:
    """Scans the process table; reads a process's environment once per (pid, starttime)."""

    proc_root: str = "/proc"
    self_pid: int = field(default_factory=os.getpid)
    jobs: frozenset[str] = frozenset()  # when set, only these job ids are tracked
    # (pid, starttime, comm) -> its RankProcess, or None when it is not a rank. comm is in
    # the key because an exec (a wrapper script exec'ing python) changes it.
    _cache: dict[tuple[int, int, str], RankProcess | None] = field(default_factory=dict)

    def scan(self) -> list[RankProcess]:
        stats: dict[int, Stat] = {}
        for name in os.listdir(self.proc_root):
            if name.isdigit():
                try:
                    stats[int(name)] = read_stat(self.proc_root, int(name))
                except (OSError, ValueError):
                    continue  # gone already
        parents = {pid: s.ppid for pid, s in stats.items()}
        live_keys = {(pid, s.starttime, s.comm) for pid, s in stats.items()}
        for key in [k for k in self._cache if k not in live_keys]:
            del self._cache[key]
        candidates = {}
        for pid, stat in stats.items():
            key = (pid, stat.starttime, stat.comm)
            if key not in self._cache:
                self._cache[key] = self._inspect(stat)
            proc = self._cache[key]
            if proc is None or _descends_from(pid, self.self_pid, parents):
                continue
            if self.jobs and proc.identity.job_id not in self.jobs:
                continue
            candidates[pid] = proc
        return drop_helpers(candidates, parents)

    def _inspect(self, stat: Stat) -> RankProcess | None:
        base = f"{self.proc_root}/{stat.pid}"
        try:
            with open(f"{base}/environ", "rb") as f:
                env = parse_environ(f.read())
            if not any(v in env for v, _, _ in RANK_VARIABLES):
                return None
            with open(f"{base}/cmdline", "rb") as f:
                argv = parse_cmdline(f.read())
            try:
                exe = os.readlink(f"{base}/exe")
            except OSError:
                exe = ""
        except OSError:
            # Gone, a kernel thread, or not ours to read: not a rank we can watch.
            return None
        if not is_python(exe, argv) or is_launcher(argv):
            return None
        identity = rank_identity(env, stat.ppid)
        if identity is None:
            return None
        return RankProcess(stat.pid, stat.ppid, stat.starttime, identity, " ".join(argv)[:4096])
