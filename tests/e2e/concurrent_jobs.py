"""Several real jobs in one test, watched at once: their start-ups and their waits for a verdict overlap.

Tests of one shape (start a job, wait for its verdict, check a few things) spend most of their time
waiting. A test that holds several such cases launches all their jobs first, then runs each case's
check in a thread of its own; the session's one agent and monitor see every job (each has its own
job id: its own master port). Every check runs to its end, so one failing case hides no other, and
the test fails naming each case that failed, with its job's log tail.

At most MAX_JOBS jobs at once (6 ranks and 3 launchers): the suite's 6 workers share 2 cores.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from hangwatch.demo import harness
from hangwatch.demo.harness import Job, MonitorClient, Service
from tests.e2e.conftest import VERDICT_TIMEOUT

MAX_JOBS = 3
# Jobs started together start slower on a loaded machine (torch imports, rendezvous): a verdict gets
# this long, where one job alone gets VERDICT_TIMEOUT. What the verdict must be is unchanged.
VERDICT_TIMEOUT_TOGETHER = VERDICT_TIMEOUT + 15.0


@dataclass
class Watched:
    """What a case's check is given: its job, and a client of its own (one httpx client per thread)."""

    job: Job
    client: MonitorClient

    def wait_for_verdict(self, verdict: str, timeout: float = VERDICT_TIMEOUT_TOGETHER, *,
                         culprits: Sequence[int] | None = None, observations: list | None = None,
                         where: Callable[[dict], bool] | None = None) -> dict:
        """As the ``wait_for_verdict`` fixture: the job dict, or an AssertionError showing the last answer."""
        return self.client.wait_for_verdict(self.job.job_id, verdict, timeout, culprits=culprits,
                                            observations=observations, where=where)


@dataclass
class Case:
    """One job of a test and what must hold for it; ``name`` says which case failed."""

    name: str
    job: Job
    check: Callable[[Watched], None]


def check_together(cases: Sequence[Case], monitor: Service, agent: Service) -> None:
    """Run every case's check at once, each in a thread; fail naming every case that failed."""
    if len(cases) > MAX_JOBS:
        raise ValueError(f"{len(cases)} jobs at once: at most {MAX_JOBS} (the suite's workers share 2 cores)")
    if len({case.name for case in cases}) != len(cases):
        raise ValueError("two cases of one name: a failure would not say which")
    failures: dict[str, str] = {}
    threads = [threading.Thread(target=_run, args=(case, monitor.url, failures), name=case.name, daemon=True)
               for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        failed = [case for case in cases if case.name in failures]
        report = [f"{len(failed)} of {len(cases)} cases failed: {', '.join(repr(case.name) for case in failed)}"]
        for case in failed:
            report += [f"=== case {case.name!r} ({case.job.job_id}): {failures[case.name]}",
                       "job log:", case.job.log_tail()]
        report += ["=== agent log:", agent.log_tail(15), "=== monitor log:", monitor.log_tail(15)]
        pytest.fail("\n".join(report), pytrace=False)


def _run(case: Case, monitor_url: str, failures: dict[str, str]) -> None:
    client = MonitorClient(monitor_url)
    try:
        if case.job.kind == "torchrun":
            case.job.rank_pids(timeout=30)  # record the workers in the reaper at once, as the fixture does
        case.check(Watched(case.job, client))
    except BaseException as e:  # an assert, a verdict's timeout, pytest.fail: each is the case's result
        failures[case.name] = f"{type(e).__name__} at {_failing_line(e)}: {e}"
    finally:
        client.close()


def _failing_line(e: BaseException) -> str:
    """Where in the case's check it failed: the innermost frame neither here nor in the harness."""
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if f.filename not in (__file__, harness.__file__)] or frames
    return f"{Path(own[-1].filename).name}:{own[-1].lineno}"
