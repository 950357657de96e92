"""Which job a ``--log`` file belongs to: its lines are credited to that job's ranks only.

A node often runs several jobs, and a log file the agent was told to follow says nothing of whose
it is. It is tied to a job by:
  - the operator: ``--log JOB=PATH`` (JOB: the job id, a torchelastic run id or a Slurm job id);
  - who writes it, read from /proc: a rank of the job, one of the ranks' ancestors (the launcher,
    or a shell that redirected its output there), or a process reading a pipe that one of them
    writes to (``torchrun train.py | tee train.log``);
  - nobody holding it open for writing while a single job runs on the node (a logger that opens,
    appends and closes).
Written by processes of several jobs, written only by processes of no job, or held by nobody while
several jobs run: the file's lines are credited to no job. Guessing would show one job's steps as
another's progress and hide a deadlock (issue 20). The operator's word holds against writers of no
job, not against another job's processes: a file named for job A that job B's processes also write
is credited to no job, with a warning naming B and its pids (issue 33).

``decide`` is pure; ``LogOwners`` reads /proc and keeps each file's tie for RESOLVE_EVERY_S.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from agent.identity import RankProcess
from agent.procstat import ancestors, open_flags, opened_for_writing, read_stat

log = logging.getLogger("agent")

# A file's tie is looked up again this often (writers come and go), and at once when the set of
# jobs on the node changes or the file is new.
RESOLVE_EVERY_S = 10.0
# Other names a job goes by on --log JOB=PATH, from the rank's allowlisted environment.
JOB_ALIAS_ENV = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


@dataclass(frozen=True)
class LogSource:
    """One --log argument: PATH, or JOB=PATH."""

    path: str
    job: str | None = None

    @classmethod
    def parse(cls, text: str) -> LogSource:
        # A job id holds no "/": "a=b/c.log" is the job a's, "./x=1.log" a path.
        head, sep, tail = text.partition("=")
        if sep and head and tail and "/" not in head:
            return cls(tail, head)
        return cls(text)


def job_aliases(rank: RankProcess) -> set[str]:
    names = {rank.identity.job_id}
    for key in JOB_ALIAS_ENV:
        if rank.env.get(key) and rank.env[key] != "none":
            names.add(rank.env[key])
    return names


@dataclass(frozen=True)
class Tie:
    """The job a file's lines go to (None: to no job), and how that was decided."""

    job: str | None
    how: str


def decide(named: str | None, writers: Mapping[int, frozenset[str]], node_jobs: frozenset[str]) -> Tie:
    """The tie of one file: ``named`` from --log JOB=PATH; ``writers``, each process that has the
    file open for writing (by pid) -> the jobs it belongs to (empty: it belongs to none), a named
    job's other ids already read as ``named``."""
    if named is not None:
        return _named_tie(named, writers)
    jobs = frozenset().union(*writers.values())
    if len(jobs) == 1:
        return Tie(next(iter(jobs)), "written by the job's processes")
    if len(jobs) > 1:
        return Tie(None, f"written by processes of {len(jobs)} jobs ({', '.join(sorted(jobs))})")
    if writers:
        return Tie(None, "written only by processes of no job on this node")
    if len(node_jobs) == 1:
        return Tie(next(iter(node_jobs)), "nobody holds it open and one job runs on this node")
    if node_jobs:
        return Tie(None, f"nobody holds it open and {len(node_jobs)} jobs run on this node: name the job "
                         "with --log JOB=PATH")
    return Tie(None, "no job runs on this node")


def _named_tie(named: str, writers: Mapping[int, frozenset[str]]) -> Tie:
    """The operator's word, unless processes of another job write the file too: their lines would
    show as the named job's progress and could hide its hang. A process of the named job and of
    another (a shell that launched both) counts as the other's: its output may be that job's.
    Writers of no job leave the word standing: a job's output often reaches its file through
    processes that are not its ranks' ancestors (Slurm's batch shell and srun write slurm-%j.out,
    the ranks are slurmstepd's children) or that this agent does not see as ranks (another PID
    namespace, a job left out by --job), and naming the file is how the operator ties those."""
    others = {pid: jobs - {named} for pid, jobs in writers.items() if jobs - {named}}
    if not others:
        return Tie(named, "named on --log")
    jobs = sorted(frozenset().union(*others.values()))
    pids = sorted(others)
    return Tie(None, f"named for job {named} on --log but also written by {_plural('job', jobs)} "
                     f"({_plural('pid', pids)})")


def _plural(word: str, items: list) -> str:
    return f"{word}{'s' if len(items) > 1 else ''} {', '.join(map(str, items))}"


def _ids_of(named: str | None, ranks: list[RankProcess]) -> set[str]:
    """The job ids of the job named on --log (it may be named by its run id or Slurm job id): a
    writer of that job counts as the named job's, not as another's."""
    if named is None:
        return set()
    return {r.identity.job_id for r in ranks if named in job_aliases(r)}


def _say(source: LogSource, tie: Tie) -> None:
    """Once per change of a file's tie. A named file credited to no job is a warning: the
    operator's word was overruled (another job writes it)."""
    if tie.job is not None:
        log.info("log %s: credited to job %s (%s)", source.path, tie.job, tie.how)
    else:
        log.log(logging.WARNING if source.job is not None else logging.INFO,
                "log %s: credited to no job: %s", source.path, tie.how)


@dataclass
class _Known:
    tie: Tie
    at: float
    node_jobs: frozenset[str]


class LogOwners:
    def __init__(self, proc_root: str = "/proc", own_pid: int | None = None):
        self.proc_root = proc_root
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self._known: dict[tuple[int, int], _Known] = {}

    def ties(self, files: dict[tuple[int, int], LogSource], ranks: list[RankProcess],
             now: float) -> dict[tuple[int, int], Tie]:
        """The tie of each followed --log file (by (device, inode)), looked up again when due."""
        node_jobs = frozenset(r.identity.job_id for r in ranks)
        due = {key: source for key, source in files.items() if self._due(key, now, node_jobs)}
        found = self._resolve(due, ranks, node_jobs) if due else {}
        out: dict[tuple[int, int], Tie] = {}
        for key, source in files.items():
            if key in found:
                previous = self._known.get(key)
                if previous is None or previous.tie != found[key]:
                    _say(source, found[key])
                self._known[key] = _Known(found[key], now, node_jobs)
            out[key] = self._known[key].tie
        for key in [k for k in self._known if k not in files]:
            del self._known[key]
        return out

    def _due(self, key, now: float, node_jobs: frozenset[str]) -> bool:
        known = self._known.get(key)
        return known is None or known.node_jobs != node_jobs or now - known.at >= RESOLVE_EVERY_S or now < known.at

    def _resolve(self, files: dict[tuple[int, int], LogSource], ranks: list[RankProcess],
                 node_jobs: frozenset[str]) -> dict[tuple[int, int], Tie]:
        writers = self._writers(files)
        if not any(writers.values()):
            return {key: decide(source.job, {}, node_jobs) for key, source in files.items()}
        jobs_of = self._jobs_by_process(ranks)
        pipe_jobs: dict[str, set[str]] = {}
        for pid, jobs in jobs_of.items():
            for fd in (1, 2):
                target = self._link(pid, fd)
                if target and target.startswith("pipe:"):
                    pipe_jobs.setdefault(target, set()).update(jobs)
        out = {}
        for key, source in files.items():
            named_ids = _ids_of(source.job, ranks)
            writer_jobs = {}
            for pid in writers[key]:
                jobs = set(jobs_of.get(pid, ()))
                stdin = self._link(pid, 0)
                if stdin and stdin in pipe_jobs:
                    jobs |= pipe_jobs[stdin]
                writer_jobs[pid] = frozenset(source.job if job in named_ids else job for job in jobs)
            out[key] = decide(source.job, writer_jobs, node_jobs)
        return out

    def _jobs_by_process(self, ranks: list[RankProcess]) -> dict[int, set[str]]:
        """Each rank and each of its ancestors (agent.procstat.ancestors) -> its jobs."""
        out: dict[int, set[str]] = {}
        for rank in ranks:
            pid, job = rank.pid, rank.identity.job_id
            out.setdefault(pid, set()).add(job)
            for parent in self._ancestors_of(rank):
                if parent == self.own_pid:
                    break
                out.setdefault(parent, set()).add(job)
        return out

    def _ancestors_of(self, rank: RankProcess) -> Iterator[int]:
        # The rank's parent as discovery saw it; the ones above read now.
        return ancestors(rank.pid, lambda pid: rank.ppid if pid == rank.pid else self._parent_of(pid))

    def _parent_of(self, pid: int) -> int | None:
        try:
            return read_stat(self.proc_root, pid).ppid
        except (OSError, ValueError):
            return None  # gone

    def _writers(self, files: dict[tuple[int, int], LogSource]) -> dict[tuple[int, int], list[int]]:
        """Processes holding each file open for writing (the agent itself aside), from every
        process's fds: names are compared first (cheap), then the file itself."""
        names = {os.path.basename(source.path) for source in files.values()}
        out: dict[tuple[int, int], list[int]] = {key: [] for key in files}
        try:
            pids = [int(e) for e in os.listdir(self.proc_root) if e.isdigit()]
        except OSError:
            return out
        for pid in pids:
            if pid == self.own_pid:
                continue
            fd_dir = f"{self.proc_root}/{pid}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:  # gone, or a kernel thread
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"{fd_dir}/{fd}")
                except OSError:
                    continue
                if not target.startswith("/") or os.path.basename(target.removesuffix(" (deleted)")) not in names:
                    continue
                key = self._open_file_key(f"{fd_dir}/{fd}")
                if key in out and opened_for_writing(open_flags(self.proc_root, pid, fd)) and pid not in out[key]:
                    out[key].append(pid)
        return out

    @staticmethod
    def _open_file_key(link: str) -> tuple[int, int] | None:
        try:
            st = os.stat(link)  # follows the magic link to the open file itself, in any mount namespace
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _link(self, pid: int, fd: int) -> str | None:
        try:
            return os.readlink(f"{self.proc_root}/{pid}/fd/{fd}")
        except OSError:
            return None
