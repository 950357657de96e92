"""End-to-end fixtures: one real monitor and one real agent per session, real gloo jobs per test
(and a monitor and agent of a test's own where it needs other settings: ``short_window_monitor``).

Everything is on loopback. Every process is recorded in a ``Reaper`` and killed on teardown,
also when a test fails (torchrun's workers run in their own sessions: the reaper finds them
under the launcher and kills them by pid).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from hangwatch.demo.harness import (
    Job,
    MonitorClient,
    Reaper,
    Service,
    launch_plain,
    launch_torchrun,
    start_agent,
    start_monitor,
    stop_gently,
)

# Stall early (the job has made some progress by then: the cadence is known) and give each
# verdict this long from the launch (start-up of 2 torch processes on 2 cores takes ~6 s).
STALL_STEP = 30
VERDICT_TIMEOUT = 45.0


@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def session_reaper() -> Iterator[Reaper]:
    reaper = Reaper()
    try:
        yield reaper
    finally:
        reaper.close()


@pytest.fixture(scope="session")
def monitor(session_reaper: Reaper, e2e_dir: Path) -> Iterator[Service]:
    svc = start_monitor(session_reaper, e2e_dir)
    try:
        yield svc
    finally:
        stop_gently(svc.proc)


@pytest.fixture(scope="session")
def agent(session_reaper: Reaper, e2e_dir: Path, monitor: Service) -> Iterator[Service]:
    svc = start_agent(session_reaper, e2e_dir, monitor.url, interval=1.0)
    try:
        yield svc
    finally:
        stop_gently(svc.proc)


@pytest.fixture(scope="session")
def client(monitor: Service) -> Iterator[MonitorClient]:
    c = MonitorClient(monitor.url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    """Per-test processes (the training jobs); killed when the test ends, pass or fail."""
    r = Reaper()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def torchrun_job(reaper: Reaper, tmp_path: Path, agent: Service) -> Callable[..., Job]:
    def start(*train_args: str, nproc: int = 2, env: dict[str, str] | None = None) -> Job:
        job = launch_torchrun(reaper, tmp_path, list(train_args), nproc=nproc, env=env)
        job.rank_pids(timeout=30)  # record the workers in the reaper at once
        return job

    return start


@pytest.fixture
def plain_job(reaper: Reaper, tmp_path: Path, agent: Service) -> Callable[..., Job]:
    def start(*train_args: str, world_size: int = 2, nranks: int | None = None) -> Job:
        return launch_plain(reaper, tmp_path, list(train_args), world_size=world_size, nranks=nranks)

    return start


@pytest.fixture
def wait_for_verdict(client: MonitorClient, monitor: Service, agent: Service) -> Callable[..., dict]:
    """``wait_for_verdict(job, verdict, timeout=VERDICT_TIMEOUT, culprits=None, where=None)`` -> the job dict.

    ``job`` is a Job or a job id. On timeout the test fails showing the last answer, the
    job's log tail and the agent's and monitor's log tails.
    """
    return verdict_waiter(client, monitor, agent)


def verdict_waiter(client: MonitorClient, monitor: Service, agent: Service) -> Callable[..., dict]:
    def wait(job: Job | str, verdict: str, timeout: float = VERDICT_TIMEOUT, *,
             culprits: Sequence[int] | None = None, observations: list | None = None,
             where: Callable[[dict], bool] | None = None) -> dict:
        job_id = job if isinstance(job, str) else job.job_id

        def context() -> str:
            parts = []
            if not isinstance(job, str):
                parts.append("job log:\n" + job.log_tail())
            parts.append("agent log:\n" + agent.log_tail(15))
            parts.append("monitor log:\n" + monitor.log_tail(15))
            return "\n".join(parts)

        try:
            return client.wait_for_verdict(job_id, verdict, timeout, culprits=culprits,
                                           observations=observations, context=context, where=where)
        except AssertionError as e:
            pytest.fail(str(e), pytrace=False)

    return wait


# The ranks' CPU levels (and run-queue waits) taken over 12 s: the monitor's straggler_window_s, 30 s
# by default. The same code and a shorter wait, for the tests that compare ranks' levels; the
# cpu_bound part of the suite, where they run one after the other, waits on them.
LEVEL_WINDOW_S = 12


@dataclass(frozen=True)
class OwnMonitor:
    """A monitor and an agent of one test's own (their processes are the test's ``reaper``'s)."""

    monitor: Service
    agent: Service
    client: MonitorClient

    def wait_for_verdict(self, job: Job | str, verdict: str, timeout: float = VERDICT_TIMEOUT, **kw) -> dict:
        """As the ``wait_for_verdict`` fixture, on this monitor."""
        return verdict_waiter(self.client, self.monitor, self.agent)(job, verdict, timeout, **kw)


@pytest.fixture
def short_window_monitor(reaper: Reaper, tmp_path: Path) -> Iterator[OwnMonitor]:
    """A monitor whose straggler window is LEVEL_WINDOW_S, and an agent reporting to it every second."""
    monitor = start_monitor(reaper, tmp_path, settings={"HANGWATCH_STRAGGLER_WINDOW_S": str(LEVEL_WINDOW_S)})
    agent = start_agent(reaper, tmp_path, monitor.url, interval=1.0)
    client = MonitorClient(monitor.url)
    try:
        yield OwnMonitor(monitor, agent, client)
    finally:
        client.close()
