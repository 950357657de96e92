"""Find the training ranks on this node from /proc.

A rank is a Python process whose environment names its rank and world size (torchrun and
other env:// launchers, accelerate, DeepSpeed, srun, mpirun: agent/identity.py has the
rules and the job id order), or one the process tree names (agent/derived_ranks.py):
Lightning's own launcher (rank 0 is the parent of its LOCAL_RANK children) and
``torch.multiprocessing.spawn`` (ranks in start order). Launchers (torchrun,
``python -m torch.distributed.run/launch``, ``accelerate launch``, ``deepspeed`` and
``deepspeed.launcher.launch``), this agent and its children (py-spy), and helper processes
that inherit a rank's environment (DataLoader and compile workers) are left out.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field

from agent.derived_ranks import Candidate, DerivedRanks, spawn_facts
from agent.identity import (  # noqa: F401 -- RankIdentity: re-exported
    RankIdentity,
    RankProcess,
    carries_rank,
    is_spawn_child,
    lightning_child,
    rank_identity,
)
from agent.procinfo import is_python, parse_cmdline, parse_environ, read_exe  # noqa: F401 -- re-exported
from agent.procstat import ANCESTOR_LEVELS, CLOCK_TICKS, Stat, ancestors, read_stat, uptime_ticks
from agent.redact import DEFAULT_REDACTOR, Redactor
from agent.workload_names import read_pod_uid

# Whole words of is_launcher: a process with one of them in its argv is never a rank.
LAUNCHER_SCRIPTS = ("torchrun",)
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# What launcher_kind recognises (the program that runs, not any word of argv): script
# basename -> kind, and ``python -m`` module -> kind. Only torchrun's kinds have their argv
# read (agent/launchers.py): the others' job id comes from their workers.
LAUNCHER_PROGRAMS = {
    "torchrun": "torchrun",
    "accelerate-launch": "accelerate",
    "deepspeed": "deepspeed",
    "ds": "deepspeed",
}
LAUNCHER_PROGRAM_MODULES = {
    "torch.distributed.run": "torch.distributed.run",
    "torch.distributed.launch": "torch.distributed.launch",
    "accelerate.commands.launch": "accelerate",
    "deepspeed.launcher.launch": "deepspeed",
    "deepspeed.launcher.runner": "deepspeed",
}
TORCHRUN_KINDS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
# Launchers whose workers' environment looks like any env:// launcher's: the parent tells.
LAUNCHER_WORDS_FROM_PARENT = ("accelerate", "deepspeed")

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
    # Where NCCL's RAS service listens, and whether it runs (agent/nccl_ras.py).
    "NCCL_RAS_ADDR",
    "NCCL_RAS_ENABLE",
    # Whether torch's Flight Recorder records, and where a rank's dump goes (agent/flight_recorder.py).
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_FR_DUMP_DYNAMIC_FILE_NAME",
    # torch's worker server socket: stacks without ptrace, live Flight Recorder (agent/torch_worker_server.py).
    "TORCH_WORKER_SERVER_SOCKET",
    # What people call the job (monitor/engine/job_names.py): Slurm's ids, and a pod's downward-API
    # variables (POD_UID is also read from the cgroup path: agent/workload_names.py). HOSTNAME
    # is a pod's name in Kubernetes; the monitor uses it only for a rank in a pod.
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_JOB_NAME",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_UID",
    "HOSTNAME",
)
# torchrun reads any of its options from PET_<OPTION> when not on the command line.
LAUNCHER_ENV_PREFIX = "PET_"
# Processes younger than this are inspected again at every scan (Discovery._young).
YOUNG_S = 2.0


@dataclass(frozen=True)
class LauncherProcess:
    """A launcher (torchrun's elastic agent, torch.distributed.launch, accelerate, DeepSpeed's
    runner and launch): no RANK of its own."""

    pid: int
    ppid: int
    starttime: int
    kind: str  # "torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed"
    # The launcher's own arguments (after the script or -m module); torchrun's kinds only.
    argv: tuple[str, ...]
    cmdline: str
    env: dict[str, str] = field(default_factory=dict, compare=False)  # PET_* only


@dataclass(frozen=True)
class _Seen:
    """What one process is, cached per (pid, starttime, comm)."""

    rank: RankProcess | None = None
    launcher: LauncherProcess | None = None
    # RANK and WORLD_SIZE (or the SLURM/MPI pair, or Lightning's child variables) in its environment
    carries_rank: bool = False
    cmdline: str = ""
    # A rank its environment does not name (Lightning child, mp.spawn process): the process
    # tree decides (agent/derived_ranks.py).
    candidate: Candidate | None = None


@dataclass(frozen=True)
class OrphanProcess:
    pid: int
    starttime: int
    cmdline: str
    # What discovery knows of it: the rank it was (its job id), or the launcher it is.
    rank: RankProcess | None = field(default=None, compare=False)
    launcher: LauncherProcess | None = field(default=None, compare=False)


def allowlisted_env(env: dict[str, str], redactor: Redactor = DEFAULT_REDACTOR) -> dict[str, str]:
    # Redacted before the cut: a cut inside a URL's userinfo would hide its "@" from the redactor.
    return {k: redactor.text(env[k])[:1024] for k in ENV_ALLOWLIST if k in env}


def launcher_kind(argv: list[str]) -> tuple[str, int] | None:
    """(kind, index of the launcher's first own argument) when argv runs a launcher.

    Stricter than is_launcher: the launcher must be what runs, not an argument of a
    training script ("python train.py --launcher torchrun" is not torchrun).
    ``accelerate`` is a launcher only as ``accelerate launch`` (not ``accelerate config``).
    """

    def program(i: int) -> tuple[str, int] | None:
        name = os.path.basename(argv[i])
        if name == "accelerate":
            return ("accelerate", i + 2) if argv[i + 1 : i + 2] == ["launch"] else None
        return (LAUNCHER_PROGRAMS[name], i + 1) if name in LAUNCHER_PROGRAMS else None

    if not argv:
        return None
    found = program(0)
    if found:
        return found
    i = 1
    # python [interpreter options] (torchrun | -m torch.distributed.run ...)
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 1
    if i < len(argv) and argv[i] != "-m":
        return program(i)
    if i + 1 < len(argv) and argv[i + 1] in LAUNCHER_PROGRAM_MODULES:
        return LAUNCHER_PROGRAM_MODULES[argv[i + 1]], i + 2
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
        same_rank = (proc.identity.job_id, proc.identity.rank)
        helper = any(
            (other := candidates.get(pid)) is not None and (other.identity.job_id, other.identity.rank) == same_rank
            for pid in ancestors(proc.pid, parents.get)
        )
        if not helper:
            kept.append(proc)
    return sorted(kept, key=lambda p: (p.identity.job_id, p.identity.rank, p.pid))


def _named_by_parent(proc: RankProcess, kinds: dict[int, str]) -> RankProcess:
    """accelerate's and DeepSpeed's workers carry plain RANK/WORLD_SIZE: their parent says who
    launched them."""
    kind = kinds.get(proc.ppid)
    if kind not in LAUNCHER_WORDS_FROM_PARENT:
        return proc
    return dataclasses.replace(proc, identity=dataclasses.replace(proc.identity, launcher=kind))


def _descends_from(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    return pid == ancestor or ancestor in ancestors(pid, parents.get, ANCESTOR_LEVELS * 2)


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
    # Keys inspected while their process was younger than YOUNG_S: looked at again each scan.
    # A child forked by python that execs python again (Lightning's and mp.spawn's ranks) keeps
    # its pid, start time and comm, but between the fork and the exec it shows its parent's
    # command line and environment: cached then, it would never be seen as a rank.
    _young: set[tuple[int, int, str]] = field(default_factory=set)
    launchers: list[LauncherProcess] = field(default_factory=list)
    workers: dict[int, list[RankProcess]] = field(default_factory=dict)  # launcher pid -> ranks
    orphans: list[OrphanProcess] = field(default_factory=list)
    # Every other PPID-1 process: (pid, starttime), for finding who holds a master port.
    other_ppid1: list[tuple[int, int]] = field(default_factory=list)
    derived: DerivedRanks | None = None  # Lightning's and mp.spawn's ranks (built from proc_root)
    # Every command line and environment value reported passes through it (agent/redact.py).
    redactor: Redactor = DEFAULT_REDACTOR

    def __post_init__(self) -> None:
        if self.derived is None:
            self.derived = DerivedRanks(self.proc_root, self._report_env, redactor=self.redactor)

    def _report_env(self, env: dict[str, str], pid: int) -> dict[str, str]:
        reported = allowlisted_env(env, self.redactor)
        if "POD_UID" not in reported:
            uid = read_pod_uid(self.proc_root, pid)  # once per process: _Seen is cached
            if uid:
                reported["POD_UID"] = uid
        return reported

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
        unnamed: list[Candidate] = []  # ranks the environment does not name: the tree decides
        not_parents: set[int] = set()
        self._young &= live_keys
        now_ticks = uptime_ticks(self.proc_root)
        for pid, stat in stats.items():
            key = (pid, stat.starttime, stat.comm)
            if key not in self._cache or key in self._young:
                self._cache[key] = self._inspect(stat)
                if now_ticks is not None and now_ticks - stat.starttime < YOUNG_S * CLOCK_TICKS:
                    self._young.add(key)
                else:
                    self._young.discard(key)
            seen = self._cache[key]
            if pid == self.self_pid or (
                (seen.rank or seen.launcher or seen.carries_rank or seen.candidate)
                and _descends_from(pid, self.self_pid, parents)
            ):
                continue
            if seen.rank or seen.launcher or seen.carries_rank:
                not_parents.add(pid)
            if seen.candidate:
                unnamed.append(seen.candidate)
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
        for proc in self.derived.find(stats, unnamed, not_parents):
            if not self.jobs or proc.identity.job_id in self.jobs:
                candidates[proc.pid] = proc
        kinds = {launcher.pid: launcher.kind for launcher in launchers}
        ranks = [_named_by_parent(proc, kinds) for proc in drop_helpers(candidates, parents)]
        self.workers = {}
        for proc in ranks:
            self.workers.setdefault(proc.ppid, []).append(proc)
        # A launcher that started another (deepspeed -> deepspeed.launcher.launch) is a
        # wrapper: the inner one has the workers; the outer one never will.
        wrappers = {launcher.ppid for launcher in launchers}
        self.launchers = sorted((p for p in launchers if p.pid not in wrappers), key=lambda p: p.pid)
        self.orphans = sorted(orphans, key=lambda p: p.pid)
        self.other_ppid1 = other_ppid1
        return ranks

    def cmdline_of(self, pid: int) -> str:
        try:
            with open(f"{self.proc_root}/{pid}/cmdline", "rb") as f:
                return self.redactor.cmdline(parse_cmdline(f.read()))
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
        has_rank = carries_rank(env)
        launcher = launcher_kind(argv)
        if launcher:
            cmdline = self.redactor.cmdline(argv)
            kind, first = launcher
            torchrun = kind in TORCHRUN_KINDS  # only torchrun's options are read (agent/launchers.py)
            pet = {k: v[:1024] for k, v in env.items() if k.startswith(LAUNCHER_ENV_PREFIX)} if torchrun else {}
            own_args = tuple(argv[first:]) if torchrun else ()
            return _Seen(
                launcher=LauncherProcess(stat.pid, stat.ppid, stat.starttime, kind, own_args, cmdline, pet),
                carries_rank=has_rank,
                cmdline=cmdline,
            )
        lightning = None if has_rank else lightning_child(env, stat.ppid)
        spawned = not has_rank and is_spawn_child(argv)
        if not (has_rank or lightning or spawned):
            return _Seen()  # most processes: nothing kept
        cmdline = self.redactor.cmdline(argv)  # only now: most processes never need it
        if not is_python(read_exe(self.proc_root, stat.pid), argv) or is_launcher(argv):
            return _Seen(carries_rank=has_rank or bool(lightning), cmdline=cmdline)
        if lightning or spawned:
            candidate = Candidate(stat.pid, stat.ppid, stat.starttime, cmdline, tuple(argv),
                                  self._report_env(env, stat.pid),
                                  lightning, spawn_facts(env) if spawned and not lightning else None)
            return _Seen(carries_rank=bool(lightning), cmdline=cmdline, candidate=candidate)
        identity = rank_identity(env, stat.ppid)
        if identity is None:
            return _Seen(carries_rank=True, cmdline=cmdline)
        rank = RankProcess(stat.pid, stat.ppid, stat.starttime, identity, cmdline, self._report_env(env, stat.pid))
        return _Seen(rank=rank, carries_rank=True, cmdline=cmdline)
