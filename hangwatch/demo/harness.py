"""Start and stop real monitors, agents and training jobs on this machine.

Shared by ``hangwatch demo``, the end-to-end tests (tests/e2e/conftest.py)
and the benchmarks. Everything listens on loopback only. Every process
started here is recorded in a :class:`Reaper`, which kills it (and, for
torchrun, the workers it started in their own sessions) on ``close()``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hangwatch_common.http_client import httpx
import psutil

import hangwatch.demo.workloads

TRAIN_SCRIPT = Path(hangwatch.demo.workloads.__file__).resolve().parent / "train.py"
LOOPBACK = "127.0.0.1"
STALL_MARKER = re.compile(r"HANGWATCH-STALL t=(?P<t>[0-9.]+) mode=(?P<mode>\S+) rank=(?P<rank>\d+)")


# Under pytest-xdist each worker takes its ports from a block of its own, below the kernel's
# ephemeral range: a port picked with bind(0) is ephemeral, and between picking it and binding it a
# job of another worker may take it as the source port of a connection (gloo opens many).
# Where in its block the next pick starts is kept in a file, not in the process: a worker's test and
# the `hangwatch demo` it runs as a subprocess pick from the same block, and the worker's own agent
# reports the demo's ranks to the worker's monitor: two jobs on one MASTER_PORT would be one job there.
PORT_BLOCK_START = 10000
PORT_BLOCK_SIZE = 1000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_block(worker: str) -> range | None:
    """``gw3`` -> its block of ports; None for a name that is not an xdist worker's or past the range."""
    m = re.fullmatch(r"gw(\d+)", worker)
    if not m:
        return None
    start = PORT_BLOCK_START + int(m.group(1)) * PORT_BLOCK_SIZE
    end = start + PORT_BLOCK_SIZE
    return range(start, end) if end <= _ephemeral_low() else None


def _bindable(port: int) -> bool:
    with socket.socket() as s:  # no SO_REUSEADDR: a port still in TIME_WAIT is skipped too
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


class _Cursor:
    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle

    def read(self) -> int:
        self.handle.seek(0)
        text = self.handle.read().strip()
        return int(text) if text.isdigit() else 0

    def write(self, value: int) -> None:
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(str(value))
        self.handle.flush()


@contextlib.contextmanager
def _block_cursor(worker: str) -> Iterator[_Cursor]:
    """The worker's next index in its block, shared by every process of the worker (locked)."""
    path = Path(tempfile.gettempdir()) / f"hangwatch-test-ports-{worker}"
    with open(path, "a+", encoding="ascii") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield _Cursor(handle)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def free_port() -> int:
    """A loopback port nobody is bound to."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    block = _worker_block(worker)
    if block is not None:
        with _block_cursor(worker) as cursor:
            first = cursor.read()
            for i in range(len(block)):
                port = block[(first + i) % len(block)]
                if _bindable(port):
                    cursor.write((first + i + 1) % len(block))
                    return port
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def tool(name: str) -> str:
    """A console script of this environment (next to the running Python), else from PATH."""
    here = Path(sys.executable).with_name(name)
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH")
    return found


class Reaper:
    """Remembers every process started (Popen objects and plain pids) and kills them all."""

    def __init__(self) -> None:
        self._popens: list[subprocess.Popen] = []
        self._procs: dict[int, psutil.Process] = {}
        self._launchers: list[int] = []

    def popen(self, cmd: Sequence[str], *, launcher: bool = False, **kw) -> subprocess.Popen:
        kw.setdefault("start_new_session", True)
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(list(cmd), **kw)
        self._popens.append(p)
        self.adopt(p.pid)
        if launcher:
            self._launchers.append(p.pid)
        return p

    def adopt(self, pid: int) -> None:
        """Record a process not started through ``popen`` (e.g. a torchrun worker)."""
        if pid in self._procs:
            return
        try:
            self._procs[pid] = psutil.Process(pid)
        except psutil.NoSuchProcess:
            pass

    def adopt_children(self) -> None:
        for pid in list(self._launchers):
            try:
                for child in psutil.Process(pid).children(recursive=True):
                    self.adopt(child.pid)
            except psutil.NoSuchProcess:
                pass

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        proc = self._procs.get(pid)
        if proc is None:
            raise ValueError(f"pid {pid} was not started by this reaper")
        try:
            if sig == signal.SIGKILL:
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass

    def close(self) -> None:
        self.adopt_children()
        # Launchers first (so torchrun does not restart anything), then the rest.
        order = sorted(self._procs.values(), key=lambda p: p.pid not in self._launchers)
        for proc in order:
            try:
                if proc.is_running():
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGKILL)
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                pass
        for p in self._popens:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        psutil.wait_procs([p for p in self._procs.values() if p.pid not in {q.pid for q in self._popens}],
                          timeout=5)
        self._popens.clear()
        self._procs.clear()
        self._launchers.clear()

    def __enter__(self) -> Reaper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stop_gently(p: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it does not end (for the monitor and agent)."""
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass


# ---------------------------------------------------------------- monitor and agent


@dataclass
class Service:
    proc: subprocess.Popen
    log: Path
    url: str = ""

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# Settings for talking to a real monitor: the harness's own loopback monitor and agent run without them.
REAL_MONITOR_SETTINGS = ("HANGWATCH_TOKEN_FILE", "HANGWATCH_READ_TOKEN_FILE", "HANGWATCH_METRICS_TOKEN_FILE",
                         "HANGWATCH_SSL_CERTFILE", "HANGWATCH_SSL_KEYFILE", "HANGWATCH_CA_FILE")


def own_settings_only() -> dict[str, str]:
    """The environment without the token files and certificates exported for a real monitor in the
    same shell: the demo's monitor would demand a token its agent and client do not have."""
    return {k: v for k, v in os.environ.items() if k not in REAL_MONITOR_SETTINGS}


def start_monitor(reaper: Reaper, workdir: Path, *, port: int | None = None, timeout: float = 30.0,
                  settings: dict[str, str] | None = None) -> Service:
    """A monitor on loopback; ``settings``: its HANGWATCH_* variables beyond the defaults."""
    port = port or free_port()
    log = workdir / "monitor.log"
    with open(log, "wb") as out:
        proc = reaper.popen([tool("hangwatch-monitor"), "--host", LOOPBACK, "--port", str(port),
                             "--db", str(workdir / "monitor.db")], stdout=out, stderr=subprocess.STDOUT,
                            env={**own_settings_only(), **(settings or {})})
    svc = Service(proc, log, f"http://{LOOPBACK}:{port}")
    wait_until_ready(proc, svc.url + "/healthz", "monitor", svc.log_tail, timeout)
    return svc


def wait_until_ready(proc: subprocess.Popen, url: str, name: str, log_tail: Callable[[], str],
                     timeout: float, poll: float = 0.1) -> None:
    """Until ``url`` answers 200; fails with the server's log if it exits or takes too long."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_tail()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    raise RuntimeError(f"{name} not ready after {timeout}s:\n{log_tail()}")


def start_agent(reaper: Reaper, workdir: Path, monitor_url: str, *, interval: float = 1.0,
                extra: Sequence[str] = ()) -> Service:
    log = workdir / "agent.log"
    with open(log, "wb") as out:
        # --own-pid-namespace: simulated nodes run agents of their own, and two agents
        # tracing one rank would fight over ptrace and report it twice.
        proc = reaper.popen([tool("hangwatch-agent"), "--monitor", monitor_url, "--interval", str(interval),
                             "--own-pid-namespace", *extra], stdout=out, stderr=subprocess.STDOUT,
                            env=own_settings_only())
    time.sleep(0.3)
    if proc.poll() is not None:
        raise RuntimeError(f"agent exited with {proc.returncode}:\n{Service(proc, log).log_tail()}")
    return Service(proc, log)


# ---------------------------------------------------------------- training jobs


@dataclass
class Job:
    job_id: str
    kind: str  # "torchrun" or "plain"
    logs: list[Path]
    launcher: subprocess.Popen | None = None
    ranks: dict[int, subprocess.Popen] = field(default_factory=dict)  # plain launch
    started_at: float = field(default_factory=time.time)
    reaper: Reaper | None = None
    nproc: int = 2
    orphan_pid: int | None = None  # a stale process this case started (kill it by pid when done)
    _pids: dict[int, int] = field(default_factory=dict)

    def text(self) -> str:
        out = []
        for log in self.logs:
            try:
                out.append(log.read_text(errors="replace"))
            except OSError:
                pass
        return "\n".join(out)

    def log_tail(self, n: int = 25) -> str:
        parts = []
        for log in self.logs:
            try:
                lines = log.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                lines = []
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def rank_pids(self, timeout: float = 60.0) -> dict[int, int]:
        """rank -> pid; for torchrun, the workers found under the launcher (and adopted by the reaper)."""
        if self.kind == "plain":
            return {r: p.pid for r, p in self.ranks.items()}
        end = time.monotonic() + timeout
        want = self.nproc
        while True:
            self._pids.update(torchrun_workers(self.launcher.pid))
            for pid in self._pids.values():
                if self.reaper:
                    self.reaper.adopt(pid)
            if len(self._pids) >= want or time.monotonic() > end:
                return dict(self._pids)
            if self.launcher.poll() is not None:
                return dict(self._pids)
            time.sleep(0.1)

    def wait_for(self, pattern: str | re.Pattern[str], timeout: float = 60.0) -> re.Match[str]:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = rx.search(self.text())
            if m:
                return m
            if self.finished():
                m = rx.search(self.text())
                if m:
                    return m
                raise AssertionError(f"job ended before {rx.pattern!r} appeared:\n{self.log_tail()}")
            time.sleep(0.1)
        raise AssertionError(f"{rx.pattern!r} not seen within {timeout}s:\n{self.log_tail()}")

    def wait_for_step(self, step: int, timeout: float = 60.0) -> None:
        self.wait_for(rf"step {step}/", timeout)

    def stall_time(self) -> float | None:
        m = STALL_MARKER.search(self.text())
        return float(m.group("t")) if m else None

    def finished(self) -> bool:
        if self.launcher is not None:
            return self.launcher.poll() is not None
        return all(p.poll() is not None for p in self.ranks.values())


def torchrun_workers(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the processes under a launcher that carry RANK while their parent does not.

    The launcher is torchrun itself, or a wrapper around it (``nsenter`` on a simulated node);
    helpers that inherit RANK from a rank (DataLoader workers) are left out.
    """
    out: dict[int, int] = {}
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    has_rank: dict[int, bool] = {launcher_pid: False}
    envs: dict[int, dict[str, str]] = {}
    for child in children:
        try:
            envs[child.pid] = child.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            envs[child.pid] = {}
        has_rank[child.pid] = "RANK" in envs[child.pid]
    for child in children:
        try:
            parent = child.ppid()
        except psutil.NoSuchProcess:
            continue
        if has_rank.get(child.pid) and not has_rank.get(parent, False):
            out[int(envs[child.pid]["RANK"])] = child.pid
    return out


def _workload_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
              "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK"):
        env.pop(k, None)
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def _nice() -> None:
    # Keep the agent and monitor responsive on small machines when ranks compute flat out.
    try:
        os.nice(5)
    except OSError:
        pass


def launch_torchrun(reaper: Reaper, workdir: Path, train_args: Sequence[str], *, nproc: int = 2,
                    port: int | None = None, name: str = "job", env: dict[str, str] | None = None,
                    tee: bool = False) -> Job:
    """``torchrun --nproc-per-node=N --master-port P train.py ...``; job id ``127.0.0.1:P``.

    torchrun without ``--standalone`` sets MASTER_ADDR=127.0.0.1 and TORCHELASTIC_RUN_ID=none,
    so the job id is predictable (``--standalone`` would give a random run id). ``tee``: the
    output goes to the log as ``torchrun ... 2>&1 | tee LOG`` sends it, so the ranks write a pipe
    and only ``tee`` writes the file.
    """
    port = port or free_port()
    # One file per job: two jobs of a test writing one file would have their lines credited to
    # neither (agent/logs.py), as for any two jobs sharing a log.
    log = workdir / f"{name}-{port}-torchrun.log"
    cmd = [tool("torchrun"), f"--nproc-per-node={nproc}", f"--master-addr={LOOPBACK}", f"--master-port={port}",
           str(TRAIN_SCRIPT), *train_args]
    if tee:
        p = reaper.popen(cmd, launcher=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=_workload_env(env), preexec_fn=_nice)
        reaper.popen(["tee", str(log)], stdin=p.stdout, stdout=subprocess.DEVNULL)
        p.stdout.close()  # tee holds the read end now
    else:
        with open(log, "wb") as out:
            p = reaper.popen(cmd, launcher=True, stdout=out, stderr=subprocess.STDOUT, env=_workload_env(env),
                             preexec_fn=_nice)
    job = Job(job_id=f"{LOOPBACK}:{port}", kind="torchrun", logs=[log], launcher=p, reaper=reaper)
    job.nproc = nproc
    return job


def launch_plain(reaper: Reaper, workdir: Path, train_args: Sequence[str], *, world_size: int = 2,
                 nranks: int | None = None, port: int | None = None, name: str = "job") -> Job:
    """N ranks started directly, the launcher setting RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.

    Each rank's stdout+stderr goes to its own file. Exited ranks are not reaped until the
    reaper closes (so the agent can read their exit status from the zombie).
    """
    port = port or free_port()
    nranks = world_size if nranks is None else nranks
    job = Job(job_id=f"{LOOPBACK}:{port}", kind="plain", logs=[], reaper=reaper)
    job.nproc = nranks
    for r in range(nranks):
        log = workdir / f"{name}-{port}-rank{r}.log"
        env = _workload_env({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world_size),
                             "LOCAL_WORLD_SIZE": str(world_size),
                             "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)})
        with open(log, "wb") as out:
            job.ranks[r] = reaper.popen([sys.executable, str(TRAIN_SCRIPT), *train_args], stdout=out,
                                        stderr=subprocess.STDOUT, env=env, preexec_fn=_nice)
        job.logs.append(log)
    return job


# ---------------------------------------------------------------- asking the monitor


class VerdictTimeout(AssertionError):
    pass


@dataclass
class Observation:
    at: float
    verdict: str | None
    culprits: tuple[int, ...]
    # What the monitor said with it (which rule spoke), for a test's failure message.
    summary: str = field(default="", compare=False)
    job_id: str = field(default="", compare=False)


class MonitorClient:
    """``url`` as the monitor is addressed; ``uds``: reach it through this Unix socket instead
    (a monitor in another network namespace, see tests/netns.py)."""

    def __init__(self, url: str, *, uds: str | None = None) -> None:
        self.url = url.rstrip("/")
        transport = httpx.HTTPTransport(uds=uds) if uds else None
        self._http = httpx.Client(timeout=5.0, transport=transport)

    def close(self) -> None:
        self._http.close()

    def _get(self, url: str, **kwargs: object) -> httpx.Response:
        """GET, once more if the server closed the kept-alive connection as the request went out (a
        monitor's guards close idle connections; on a loaded machine that can cross a new request)."""
        try:
            return self._http.get(url, **kwargs)  # type: ignore[arg-type]
        except httpx.RemoteProtocolError:
            return self._http.get(url, **kwargs)  # type: ignore[arg-type]

    def diagnose(self) -> dict:
        r = self._get(self.url + "/diagnose", params={"format": "json"})
        r.raise_for_status()
        return r.json()

    def diagnose_text(self, job_id: str | None = None) -> str:
        params = {"job": job_id} if job_id else {}
        r = self._get(self.url + "/diagnose", params=params)
        r.raise_for_status()
        return r.text

    def job(self, job_id: str) -> dict | None:
        r = self._get(self.url + "/diagnose", params={"format": "json", "job": job_id})
        if r.status_code == 404:  # the monitor holds no such job (yet): /diagnose?job= of an unknown id
            return None
        r.raise_for_status()
        for job in r.json().get("jobs", []):
            if job_id == job.get("job_id") or job_id in job.get("aliases", ()):
                return job
        return None

    def history(self, job_id: str) -> list[dict] | None:
        r = self._get(self.url + f"/api/v1/jobs/{job_id}/history")
        if r.status_code != 200:
            return None
        return r.json().get("history", [])

    def wait_for_verdict(self, job_id: str, verdict: str, timeout: float = 40.0, *,
                         culprits: Sequence[int] | None = None,
                         observations: list[Observation] | None = None,
                         on_poll: Callable[[dict | None], None] | None = None,
                         context: Callable[[], str] | None = None, poll: float = 0.25,
                         where: Callable[[dict], bool] | None = None) -> dict:
        """Poll ``/diagnose?format=json`` until the job has ``verdict`` (and these culprits,
        and ``where(job)`` holds: evidence can arrive a poll after the verdict).

        Returns the job dict; raises VerdictTimeout showing the last answer otherwise.
        ``observations`` (if given) receives every answer seen, with its time.
        """
        want = sorted(culprits) if culprits is not None else None
        end = time.monotonic() + timeout
        last: dict | None = None
        error = ""
        while True:
            try:
                job = self.job(job_id)
                error = ""
            except httpx.HTTPError as e:
                job, error = None, f"{type(e).__name__}: {e}"
            now = time.time()
            if job is not None:
                last = job
            if observations is not None:
                observations.append(Observation(now, job and job.get("verdict"),
                                                tuple(job.get("culprit_ranks", ())) if job else (),
                                                (job or {}).get("summary", ""), job_id))
            if on_poll:
                on_poll(job)
            if job and job.get("verdict") == verdict and (
                    want is None or sorted(job.get("culprit_ranks", [])) == want) and (
                    where is None or where(job)):
                return job
            if time.monotonic() >= end:
                shown = json.dumps(last, indent=1) if last else "(the monitor never listed this job)"
                msg = (f"job {job_id}: no verdict {verdict!r}"
                       f"{f' with culprits {want}' if want is not None else ''}"
                       f"{' meeting the condition' if where is not None else ''} within {timeout}s; "
                       f"last answer:\n{shown}")
                if error:
                    msg += f"\nlast error: {error}"
                if context:
                    msg += "\n" + context()
                raise VerdictTimeout(msg)
            time.sleep(poll)


# ---------------------------------------------------------------- one case, watched


@dataclass
class CaseRun:
    job: Job
    # When the failure began (epoch): the workload's HANGWATCH-STALL line, the signal sent,
    # the launch (rendezvous: the ranks never get past init), or the job's end (clean finish).
    stall_at: float | None = None
    detected_at: float | None = None
    detected: dict | None = None
    observations: list[Observation] = field(default_factory=list)
    alarms: list[Observation] = field(default_factory=list)  # quiet cases: answers not allowed
    # The monitor's recorded verdict changes for the job (/api/v1/jobs/{id}/history), when fetched:
    # every published change, also those between two polls.
    history: list[dict] | None = None

    @property
    def detection_seconds(self) -> float | None:
        if self.stall_at is None or self.detected_at is None:
            return None
        return self.detected_at - self.stall_at

    def alarms_before_stall(self) -> list[Observation]:
        """Answers other than healthy that the monitor gave before the failure began."""
        if self.stall_at is None:
            return [o for o in self.observations if o.verdict not in (None, "healthy")]
        return [o for o in self.observations if o.at < self.stall_at and o.verdict not in (None, "healthy")]


def watch_case(case, job: Job, client: MonitorClient, *, stall_step: int, timeout: float,
               linger: float = 0.0, poll: float = 0.25,
               on_event: Callable[[str, object], None] | None = None) -> CaseRun:
    """Drive a case (send its signal at ``stall_step``) and watch /diagnose until the verdict.

    ``on_event(kind, payload)`` is told "signal" (pid), "stall" (epoch), "change" (job dict,
    whenever verdict or culprits change), "detected" (job dict) and "timeout".
    """
    emit = on_event or (lambda kind, payload: None)
    run = CaseRun(job)
    quiet = getattr(case, "quiet", 0.0)
    if quiet:
        return _watch_quiet(case, job, client, quiet=quiet, timeout=timeout, poll=poll, emit=emit)
    pids = job.rank_pids(timeout=60) if not getattr(case, "orphan_port", False) else {}
    signalled = case.signal is None
    if case.expect == "rendezvous_hang" or getattr(case, "orphan_port", False):
        run.stall_at = job.started_at
    last_key = None
    deadline = time.monotonic() + timeout
    found_mono = None
    while True:
        if not signalled and f"step {stall_step}/" in job.text():
            if job.reaper is not None:
                job.reaper.adopt(pids[1])
                job.reaper.kill(pids[1], case.signal)
            else:
                os.kill(pids[1], case.signal)
            run.stall_at = time.time()
            signalled = True
            emit("signal", pids[1])
        if run.stall_at is None:
            if case.expect == "finished":
                # The job is over when its ranks are: torchrun itself exits a moment later.
                if job.finished() or (pids and not any(_running(pid) for pid in pids.values())):
                    run.stall_at = time.time()
                    emit("stall", run.stall_at)
            else:
                t = job.stall_time()
                if t is not None:
                    run.stall_at = t
                    emit("stall", t)
        j, now, last_key = _observe(client, job, run, last_key, emit)
        if j is not None:
            ok = j.get("verdict") == case.expect and (
                case.culprits is None or tuple(sorted(j.get("culprit_ranks", []))) == tuple(case.culprits))
            if ok and found_mono is None:
                found_mono = time.monotonic()
                run.detected_at, run.detected = now, j
                emit("detected", j)
        if found_mono is not None and time.monotonic() - found_mono >= linger:
            return run
        if time.monotonic() > deadline:
            emit("timeout", timeout)
            return run
        time.sleep(poll)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent (a launcher that has not reaped it yet)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _observe(client: MonitorClient, job: Job, run: CaseRun, last_key, emit: Callable[[str, object], None]):
    """One poll of the job's answer: recorded, and announced when verdict or culprits change."""
    try:
        j = client.job(job.job_id)
    except httpx.HTTPError:
        j = None
    now = time.time()
    run.observations.append(Observation(now, j and j.get("verdict"),
                                        tuple(j.get("culprit_ranks", ())) if j else ()))
    if j is not None:
        # Whether any rank is seen yet: a launcher alone is a job too (verdict healthy, "waiting for
        # its workers"), and its first ranks are worth announcing as a change of their own.
        key = (j.get("verdict"), tuple(j.get("culprit_ranks", ())), bool(j.get("ranks")))
        if key != last_key:
            last_key = key
            emit("change", j)
    return j, now, last_key


def _watch_quiet(case, job: Job, client: MonitorClient, *, quiet: float, timeout: float, poll: float,
                 emit: Callable[[str, object], None]) -> CaseRun:
    """A case that must stay quiet: watch ``quiet`` seconds from the start of its slow phase (the
    HANGWATCH-STALL line, else the first step). Answers outside ``case.allowed`` are alarms
    (``CaseRun.alarms``); ``detected`` is set when the window passed without one."""
    run = CaseRun(job)
    allowed = tuple(getattr(case, "allowed", ("healthy",)))
    deadline = time.monotonic() + timeout + quiet
    last_key = None
    while time.monotonic() < deadline:
        if run.stall_at is None:
            t = job.stall_time()
            if t is None and "step 1/" in job.text():
                t = time.time()
            if t is not None:
                run.stall_at = t
                emit("stall", t)
        j, now, last_key = _observe(client, job, run, last_key, emit)
        if j is not None:
            if j.get("verdict") not in allowed:
                run.alarms.append(run.observations[-1])
        if run.stall_at is not None and now - run.stall_at >= quiet:
            if not run.alarms:
                run.detected_at, run.detected = now, j
                emit("detected", j)
            return run
        if job.finished():
            break
        time.sleep(poll)
    emit("timeout", timeout)
    return run


# ---------------------------------------------------------------- stale processes


def start_orphan_listener(port: int, host: str = LOOPBACK, *, seconds: float = 600.0) -> int:
    """A ``python -c`` that listens on host:port, double-forked so that its PPID becomes 1
    (or the nearest subreaper), like a training process left behind by a dead launch.

    Returns its pid; the caller kills it by that pid (``kill_pid``). It exits by itself after
    ``seconds`` should the caller die first.
    """
    code = (
        "import os, socket, sys, time\n"
        "r, w = os.pipe()\n"
        "if os.fork():\n"
        "    os.close(w); sys.stdout.write(os.read(r, 32).decode()); sys.exit(0)\n"
        "os.setsid()\n"
        "if os.fork():\n"
        "    os._exit(0)\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(({host!r}, {port})); s.listen(16)\n"
        "os.write(w, str(os.getpid()).encode()); os.close(w)\n"
        "for fd in (0, 1, 2):\n"
        "    os.dup2(os.open(os.devnull, os.O_RDWR), fd)\n"
        f"time.sleep({seconds})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    if not out.stdout.strip().isdigit():
        raise RuntimeError(f"orphan listener did not start: {out.stderr.strip()}")
    pid = int(out.stdout.strip())
    end = time.monotonic() + 5
    while time.monotonic() < end:  # the middle process has exited: the listener is reparented
        try:
            if psutil.Process(pid).ppid() != os.getpid():
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    return pid


def kill_pid(pid: int) -> None:
    """SIGKILL one process we started ourselves (by pid), and reap it if it is our child."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    try:
        psutil.Process(pid).wait(timeout=5)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass
