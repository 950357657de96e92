"""Each test's CPU, for finding where the suite's time goes (it is bound by CPU on 2 cores).

With HANGWATCH_TEST_CPU_LOG=FILE set, each worker appends a JSON line per test to FILE: its node
id, its wall seconds, and the CPU seconds the worker and the processes it reaped spent while the
test ran (``getrusage`` of itself and its children). A process a test started is counted when it
is reaped: the ranks of a job at its reaper's clean-up, a module's shared monitor at the module's
end (on the test that ended it). Orphans the worker's node init reaps (tests/node_worker.py) are
not counted. ``benchmarks/suite_cpu.py --by-test FILE`` sums the lines by file and test.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "HANGWATCH_TEST_CPU_LOG"


def _cpu_s() -> float:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


class CpuLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cpu, wall = _cpu_s(), time.monotonic()
        yield
        # Reap what the test left to subprocess's own clean-up (a Popen dropped unwaited), which would
        # otherwise be counted on the next test that starts a process.
        cleanup = getattr(subprocess, "_cleanup", None)
        if cleanup is not None:
            cleanup()
        line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3), "cpu_s": round(_cpu_s() - cpu, 3)}
        with self.path.open("a") as out:  # one short write per line: workers append to one file
            out.write(json.dumps(line) + "\n")


def register(config: pytest.Config) -> None:
    path = os.environ.get(ENV)
    if path:
        config.pluginmanager.register(CpuLog(Path(path)), "hangwatch-cpu-log")
