"""Launchers on this node: torchrun / ``python -m torch.distributed.run`` / ``torch.distributed.launch``.

accelerate and DeepSpeed's launchers are tracked the same way (workers, exit, sockets, log),
but their argv is never read (discovery gives them none): the options below are torchrun's,
and their job id comes from their workers only.

The elastic agent has no RANK of its own, yet it is where a job that never
started shows: it sits in rendezvous waiting for a node that never joined, or
dies at once because its master port is taken. Two parts:

- ``parse_launcher_args`` / ``launcher_job_id``: pure, what its argv (and PET_*
  environment, torchrun's fallback for every option) says, and the job id its
  workers will carry (discovery's rule over the environment torchrun gives them);
- ``LauncherTracker``: per launcher its workers, exit, sockets, log errors, and a
  plain py-spy stack while it has had no workers for a while.

Checked with torch 2.13's torchrun (see tests): workers get TORCHELASTIC_RUN_ID =
--rdzv-id (default "none") and MASTER_ADDR = the --master-addr string exactly as
given ("localhost" stays "localhost"); --standalone, and a static single-node run
with neither --master-port nor --rdzv-endpoint, switch to c10d with a random
uuid as run id -- not knowable from argv, only from the workers.
"""

from __future__ import annotations

import os
import re
import stat as stat_module
from collections import deque
from dataclasses import dataclass, field

from agent.discovery import LauncherProcess, RankProcess
from agent.logpatterns import TracebackTracker, split_prefixes
from agent.exits import exit_from_stat
from agent.logs import FileTailer
from agent.procstat import read_stat

# Options whose value we keep: canonical name -> spellings (both "-" and "_" forms).
WANTED = {
    "nnodes": ("--nnodes",),
    "nproc_per_node": ("--nproc-per-node", "--nproc_per_node"),
    "node_rank": ("--node-rank", "--node_rank"),
    "master_addr": ("--master-addr", "--master_addr"),
    "master_port": ("--master-port", "--master_port"),
    "rdzv_id": ("--rdzv-id", "--rdzv_id"),
    "rdzv_backend": ("--rdzv-backend", "--rdzv_backend"),
    "rdzv_endpoint": ("--rdzv-endpoint", "--rdzv_endpoint"),
}
_SPELLING = {s: name for name, spellings in WANTED.items() for s in spellings}
# torchrun's options that take no value; every other option is taken to take one.
FLAGS = {
    "--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module",
    "--use-env", "--use_env", "--virtual-local-rank", "--virtual_local_rank",
}
STANDALONE = ("--standalone",)
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LauncherArgs:
    nnodes: str | None = None
    nproc_per_node: str | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_id: str | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    standalone: bool = False


def _to_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def parse_launcher_args(argv: list[str] | tuple[str, ...], env: dict[str, str] | None = None) -> LauncherArgs:
    """The launcher's own options (before the script), ``--x=v`` and ``--x v`` forms.

    ``argv`` starts after ``torchrun`` (or ``-m torch.distributed.run``). Options
    missing from argv come from PET_<NAME> in ``env``, as torchrun itself does.
    """
    found: dict[str, str] = {}
    standalone = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break  # the training script (or "--" before it)
        name, eq, value = arg.partition("=")
        if name in STANDALONE:
            standalone = True
        elif name not in FLAGS and not eq:  # "--x v": the value is the next word
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        if name in _SPELLING:
            found.setdefault(_SPELLING[name], value)
        i += 1
    env = env or {}
    for name in WANTED:
        pet = env.get(f"PET_{name.upper()}")
        if name not in found and pet:
            found[name] = pet
    if not standalone and env.get("PET_STANDALONE", "").lower() in ("1", "true", "yes"):
        standalone = True
    return LauncherArgs(
        nnodes=found.get("nnodes"),
        nproc_per_node=found.get("nproc_per_node"),
        node_rank=_to_int(found.get("node_rank")),
        master_addr=found.get("master_addr"),
        master_port=_to_int(found.get("master_port")),
        rdzv_id=found.get("rdzv_id"),
        rdzv_backend=found.get("rdzv_backend"),
        rdzv_endpoint=found.get("rdzv_endpoint"),
        standalone=standalone,
    )


def _max_nodes(nnodes: str | None) -> int | None:
    if not nnodes:
        return 1
    _, _, high = nnodes.partition(":")
    return _to_int(high or nnodes)


def _split_endpoint(endpoint: str) -> tuple[str, int | None]:
    if endpoint.startswith("["):  # [v6]:port
        host, _, rest = endpoint[1:].partition("]")
        return host, _to_int(rest.lstrip(":") or None)
    host, sep, port = endpoint.rpartition(":")
    return (host, _to_int(port)) if sep else (endpoint, None)


def launcher_job_id(args: LauncherArgs) -> str | None:
    """The job id (discovery.job_id) its workers will carry, when argv determines it.

    None when torchrun picks it at run time: --standalone and single-node runs without
    a port (a random uuid as run id), and non-static rendezvous with run id "none"
    (MASTER_ADDR/PORT then come from the store of node 0's agent).
    """
    backend = args.rdzv_backend or "static"
    rdzv_id = args.rdzv_id or "none"
    if args.standalone:
        return None
    if backend == "static" and not args.rdzv_endpoint and args.master_port is None and _max_nodes(args.nnodes) == 1:
        return None
    if rdzv_id != "none":
        return rdzv_id[:256]
    if backend != "static":
        return None
    if args.rdzv_endpoint:
        host, port = _split_endpoint(args.rdzv_endpoint)
        return f"{host}:{port}"[:256] if port else None
    addr = args.master_addr or DEFAULT_MASTER_ADDR
    return f"{addr}:{args.master_port or DEFAULT_MASTER_PORT}"[:256]


# --- the launcher's own log -----------------------------------------------------------

# Outside a traceback, lines that say the launch itself failed.
LAUNCH_ERROR = re.compile(
    r"address already in use|EADDRINUSE|failed to listen on any local network address"
    r"|ChildFailedError|RendezvousTimeoutError|RendezvousClosedError",
    re.IGNORECASE,
)
KEPT_ERRORS = 10


class LauncherLog:
    """Error lines of one launcher's stderr/stdout files (unprefixed lines only: "[rankN]:"
    lines are its workers')."""

    def __init__(self) -> None:
        self.tailers: dict[tuple[int, int], FileTailer] = {}
        self.tracebacks: dict[tuple[int, int], TracebackTracker] = {}
        self.errors: deque[str] = deque(maxlen=KEPT_ERRORS)

    def open_from(self, proc_root: str, pid: int) -> None:
        for fd in (2, 1):
            link = f"{proc_root}/{pid}/fd/{fd}"
            try:
                target = os.readlink(link)
                st = os.stat(link)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if stat_module.S_ISREG(st.st_mode) and key not in self.tailers:
                self.tailers[key] = FileTailer(target, link)
                self.tracebacks[key] = TracebackTracker()

    def read(self) -> None:
        for key, tailer in self.tailers.items():
            try:
                lines = tailer.read_lines()
            except OSError:
                continue
            for line in lines:
                error = launcher_error(line, self.tracebacks[key])
                if error and (not self.errors or self.errors[-1] != error):
                    self.errors.append(error)

    def close(self) -> None:
        for tailer in self.tailers.values():
            tailer.close()
        self.tailers.clear()


def launcher_error(line: str, tracker: TracebackTracker) -> str | None:
    """The error a launcher log line states, if any (pure but for the tracker's state)."""
    p = split_prefixes(line)
    if p.rank is not None or p.local_rank is not None:
        return None
    error = tracker.feed(p.text)
    if error:
        return error[:2048]
    if not tracker.inside and LAUNCH_ERROR.search(p.text):
        return p.text.strip()[:2048]
    return None


# --- tracking ---------------------------------------------------------------------------

NO_WORKERS_STACK_AFTER_S = 3.0
STOPPED = ("T", "t", "Z", "X")
STACK_EVERY_S = 5.0


def wants_stack(now: float, no_workers_since: float | None, last_stack_at: float | None) -> bool:
    """A plain dump when it has had no workers for > 3 s, at most every 5 s."""
    if no_workers_since is None or now - no_workers_since <= NO_WORKERS_STACK_AFTER_S:
        return False
    return last_stack_at is None or now - last_stack_at >= STACK_EVERY_S


@dataclass
class TrackedLauncher:
    proc: LauncherProcess
    args: LauncherArgs
    started_at: float | None
    alive: bool = True
    ended_at: float | None = None
    state: str | None = None
    workers: list[RankProcess] = field(default_factory=list)  # its live worker ranks now
    # Every worker of its latest set (a restart after a workerless gap starts a new set).
    last_workers: dict[int, RankProcess] = field(default_factory=dict)
    job_id: str | None = None
    no_workers_since: float | None = None
    last_stack_at: float | None = None
    sockets: list[dict] = field(default_factory=list)
    log: LauncherLog = field(default_factory=LauncherLog)


def launcher_report(t: TrackedLauncher, exit: dict | None, stack: dict | None) -> dict:
    a = t.args
    return {
        "pid": t.proc.pid,
        "job_id": t.job_id,
        "cmdline": t.proc.cmdline,
        "alive": t.alive,
        "exit": dict(exit) if exit else None,
        "state": "X" if not t.alive else t.state,
        "started_at": t.started_at,
        "nnodes": a.nnodes[:256] if a.nnodes else None,
        "nproc_per_node": a.nproc_per_node[:256] if a.nproc_per_node else None,
        "node_rank": a.node_rank,
        "master_addr": a.master_addr[:256] if a.master_addr else None,
        "master_port": a.master_port,
        # Its live workers; once it has exited, the last ones it had (to tie its failure to them).
        "worker_pids": (sorted(w.pid for w in t.workers) if t.alive else sorted(t.last_workers))[:1024],
        "stack": stack if t.alive and not t.workers else None,
        "sockets": t.sockets if t.alive else [],
        "log_errors": list(t.log.errors),
    }


class LauncherTracker:
    """Follows every launcher discovery finds: workers, exit, state, sockets, log, stack."""

    def __init__(self, proc_root, exits, sockets, stacks, boot_time, clock_ticks, jobs=frozenset()):
        self.proc_root = proc_root
        self.exits = exits  # agent.exits.ExitWatcher, shared with the ranks
        self.sockets = sockets  # agent.sockets.SocketReader
        self.stacks = stacks  # agent.stacks.StackSampler or None
        self.boot_time = boot_time
        self.clock_ticks = clock_ticks
        self.jobs = jobs
        self.tracked: dict[int, TrackedLauncher] = {}

    def update(
        self,
        launchers: list[LauncherProcess],
        workers: dict[int, list[RankProcess]],
        now: float,
        dump: bool = True,
        sockets_due: bool = True,
    ) -> list[str]:
        """One sweep; returns per-launcher problems (for collector health). ``dump``: may start
        py-spy dumps of workerless launchers."""
        problems = []
        for proc in launchers:
            known = self.tracked.get(proc.pid)
            if known and known.proc.starttime != proc.starttime:
                self.forget(proc.pid)
                known = None
            mine = workers.get(proc.pid, [])
            args = known.args if known else parse_launcher_args(proc.argv, proc.env)
            job = mine[0].identity.job_id if mine else (known.job_id if known else None) or launcher_job_id(args)
            if self.jobs and job not in self.jobs:
                continue
            if known is None:
                started = self.boot_time + proc.starttime / self.clock_ticks if self.boot_time is not None else None
                known = self.tracked[proc.pid] = TrackedLauncher(proc, args, started)
                self.exits.watch(proc.pid, proc.starttime)
                known.no_workers_since = now
            known.job_id, known.workers = job, mine
            if mine:
                if known.no_workers_since is not None:
                    known.last_workers = {}
                known.last_workers.update((w.pid, w) for w in mine)
                known.no_workers_since = None
            elif known.no_workers_since is None:
                known.no_workers_since = now
        for t in self.tracked.values():
            try:
                self._sample(t, now, dump, sockets_due)
            except PermissionError as e:
                problems.append(f"launcher {t.proc.pid}: {e.strerror}")
            except (FileNotFoundError, ProcessLookupError):
                pass  # ended mid-sweep: the exit watcher says so
        return problems

    def _sample(self, t: TrackedLauncher, now: float, dump: bool, sockets_due: bool) -> None:
        if t.alive and self.exits.exit_of(t.proc.pid) is not None:
            t.alive, t.ended_at = False, now
        t.log.read()  # also after the exit: its last lines say why
        if not t.alive:
            return
        if not t.log.tailers:
            t.log.open_from(self.proc_root, t.proc.pid)
        try:
            stat = read_stat(self.proc_root, t.proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            stat = None
        if stat is None or stat.starttime != t.proc.starttime or stat.state in ("Z", "X"):
            # Gone (or a zombie): without pidfds nobody else notices. With them the watcher's
            # record, already there or about to be, is the exact one.
            if not self.exits.available or (stat is not None and stat.state in ("Z", "X")):
                self.exits.record(t.proc.pid, exit_from_stat(self.proc_root, t.proc.pid, t.proc.starttime, now))
            if stat is None or stat.starttime != t.proc.starttime:
                return
        t.state = stat.state
        if sockets_due or not t.workers:  # without workers it is in rendezvous: every tick
            t.sockets = [e.report() for e in self.sockets.sockets_of(t.proc.pid)]
        if dump and self.stacks and t.state not in STOPPED and wants_stack(now, t.no_workers_since, t.last_stack_at):
            t.last_stack_at = now
            self.stacks.request(t.proc.pid, native=False)

    def dump_idle_now(self, now: float) -> None:
        """Synchronous dumps of launchers without workers that are older than the wait (for --once)."""
        for t in self.tracked.values():
            old = t.started_at is not None and now - t.started_at > NO_WORKERS_STACK_AFTER_S
            if self.stacks and t.alive and not t.workers and old and t.state not in STOPPED:
                self.stacks.dump_now(t.proc.pid)

    def reports(self) -> list[dict]:
        out = []
        for t in sorted(self.tracked.values(), key=lambda t: t.proc.pid):
            stack = self.stacks.latest(t.proc.pid)[0] if self.stacks else None
            out.append(launcher_report(t, self.exits.exit_of(t.proc.pid), stack))
        return out[:256]

    def drop_ended(self, now: float, kept_s: float) -> None:
        for pid in [p for p, t in self.tracked.items() if t.ended_at and now - t.ended_at > kept_s]:
            self.forget(pid)

    def forget(self, pid: int) -> None:
        t = self.tracked.pop(pid, None)
        if t:
            t.log.close()
        self.exits.forget(pid)
        if self.stacks:
            self.stacks.forget(pid)

    def close(self) -> None:
        for t in self.tracked.values():
            t.log.close()
