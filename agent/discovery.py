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

import functools
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
# Launch settings that explain hangs, reported as RankReport.env (nothing else is sent).
ENV_ALLOWLIST = (
    "GLOO_SOCKET_IFNAME",
    "GLOO_PORT_RANGE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_RUN_ID",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NANOCHAT_DTYPE",
)
# torchrun reads any of its options from PET_<OPTION> when not on the command line.
LAUNCHER_ENV_PREFIX = "PET_"


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
    env: dict[str, str] = field(default_factory=dict, compare=False)  # the allowlisted part


@dataclass(frozen=True)
class LauncherProcess:
    """torchrun's elastic agent (or torch.distributed.launch): no RANK of its own."""

    pid: int
    ppid: int
    starttime: int
    kind: str  # "torchrun", "torch.distributed.run", "torch.distributed.launch"
    argv: tuple[str, ...]  # the launcher's own arguments (after the script or -m module)
    cmdline: str
    env: dict[str, str] = field(default_factory=dict, compare=False)  # PET_* only


@dataclass(frozen=True)
class _Seen:
    """What one process is, cached per (pid, starttime, comm)."""

    rank: RankProcess | None = None
    launcher: LauncherProcess | None = None
    carries_rank: bool = False  # RANK and WORLD_SIZE (or the SLURM/MPI pair) in its environment
    cmdline: str = ""


@dataclass(frozen=True)
class OrphanProcess:
    pid: int
    starttime: int
    cmdline: str
    # What discovery knows of it: the rank it was (its job id), or the launcher it is.
    rank: RankProcess | None = field(default=None, compare=False)
    launcher: LauncherProcess | None = field(default=None, compare=False)


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


def allowlisted_env(env: dict[str, str]) -> dict[str, str]:
    return {k: env[k][:1024] for k in ENV_ALLOWLIST if k in env}


def launcher_kind(argv: list[str]) -> tuple[str, int] | None:
    """(kind, index of the launcher's first own argument) when argv runs a launcher.

    Stricter than is_launcher: the launcher must be what runs, not an argument of a
    training script ("python train.py --launcher torchrun" is not torchrun).
    """
    if argv and os.path.basename(argv[0]) in LAUNCHER_SCRIPTS:
        return "torchrun", 1
    i = 1
    # python [interpreter options] (torchrun | -m torch.distributed.run ...)
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 1
    if i < len(argv) and os.path.basename(argv[i]) in LAUNCHER_SCRIPTS:
        return "torchrun", i + 1
    if i + 1 < len(argv) and argv[i] == "-m" and argv[i + 1] in LAUNCHER_MODULES:
        return argv[i + 1], i + 2
    return None


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
    """Scans the process table; reads a process's environment and command line once per
    (pid, starttime, comm).

    ``scan()`` returns the ranks; the same pass leaves the launchers (``launchers``,
    with their worker ranks in ``workers``) and the leftovers whose parent is gone
    (``orphans``: PPID 1 with a launcher command line or a rank's environment).
    """

    proc_root: str = "/proc"
    self_pid: int = field(default_factory=os.getpid)
    jobs: frozenset[str] = frozenset()  # when set, only these job ids are tracked
    # When set, processes in other PID namespaces (containers, simulated nodes with an
    # agent of their own) are left alone: two agents must not report one rank.
    own_pid_namespace: bool = False
    # (pid, starttime, comm) -> what it is. comm is in the key because an exec (a wrapper
    # script exec'ing python) changes it.
    _cache: dict[tuple[int, int, str], _Seen] = field(default_factory=dict)
    launchers: list[LauncherProcess] = field(default_factory=list)
    workers: dict[int, list[RankProcess]] = field(default_factory=dict)  # launcher pid -> ranks
    orphans: list[OrphanProcess] = field(default_factory=list)
    # Every other PPID-1 process: (pid, starttime), for finding who holds a master port.
    other_ppid1: list[tuple[int, int]] = field(default_factory=list)

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
        candidates, launchers, orphans, other_ppid1 = {}, [], [], []
        for pid, stat in stats.items():
            key = (pid, stat.starttime, stat.comm)
            if key not in self._cache:
                self._cache[key] = self._inspect(stat)
            seen = self._cache[key]
            if pid == self.self_pid or (
                (seen.rank or seen.launcher or seen.carries_rank) and _descends_from(pid, self.self_pid, parents)
            ):
                continue
            if seen.launcher:
                launchers.append(seen.launcher)
            if stat.ppid == 1 and stat.state in ("Z", "X"):
                pass  # a zombie holds no port and cannot be killed: not worth a line
            elif stat.ppid == 1 and (seen.launcher or seen.carries_rank):
                orphans.append(OrphanProcess(pid, stat.starttime, seen.cmdline, seen.rank, seen.launcher))
            elif stat.ppid == 1:
                other_ppid1.append((pid, stat.starttime))
            proc = seen.rank
            if proc is None or (self.jobs and proc.identity.job_id not in self.jobs):
                continue
            candidates[pid] = proc
        ranks = drop_helpers(candidates, parents)
        self.workers = {}
        for proc in ranks:
            self.workers.setdefault(proc.ppid, []).append(proc)
        self.launchers = sorted(launchers, key=lambda p: p.pid)
        self.orphans = sorted(orphans, key=lambda p: p.pid)
        self.other_ppid1 = other_ppid1
        return ranks

    def cmdline_of(self, pid: int) -> str:
        try:
            with open(f"{self.proc_root}/{pid}/cmdline", "rb") as f:
                return " ".join(parse_cmdline(f.read()))[:4096]
        except OSError:
            return ""

    @functools.cached_property
    def _own_namespace(self) -> str | None:
        return self._pid_namespace(self.self_pid)

    def _pid_namespace(self, pid: int | str) -> str | None:
        try:
            return os.readlink(f"{self.proc_root}/{pid}/ns/pid")
        except OSError:
            return None

    def _inspect(self, stat: Stat) -> _Seen:
        base = f"{self.proc_root}/{stat.pid}"
        if self.own_pid_namespace and self._pid_namespace(stat.pid) != self._own_namespace:
            return _Seen()
        try:
            with open(f"{base}/cmdline", "rb") as f:
                argv = parse_cmdline(f.read())
            if not argv:
                return _Seen()  # a kernel thread, or a zombie
            with open(f"{base}/environ", "rb") as f:
                env = parse_environ(f.read())
        except OSError:
            # Gone, or not ours to read: not a process we can watch.
            return _Seen()
        cmdline = " ".join(argv)[:4096]
        carries_rank = any(r in env and s in env for r, s, _ in RANK_VARIABLES)
        launcher = launcher_kind(argv)
        if launcher:
            kind, first = launcher
            pet = {k: v[:1024] for k, v in env.items() if k.startswith(LAUNCHER_ENV_PREFIX)}
            return _Seen(
                launcher=LauncherProcess(stat.pid, stat.ppid, stat.starttime, kind, tuple(argv[first:]), cmdline, pet),
                carries_rank=carries_rank,
                cmdline=cmdline,
            )
        if not carries_rank:
            return _Seen()  # most processes: nothing kept
        try:
            exe = os.readlink(f"{base}/exe")
        except OSError:
            exe = ""
        if not is_python(exe, argv) or is_launcher(argv):
            return _Seen(carries_rank=carries_rank, cmdline=cmdline)
        identity = rank_identity(env, stat.ppid)
        if identity is None:
            return _Seen(carries_rank=carries_rank, cmdline=cmdline)
        rank = RankProcess(stat.pid, stat.ppid, stat.starttime, identity, cmdline, allowlisted_env(env))
        return _Seen(rank=rank, carries_rank=True, cmdline=cmdline)
