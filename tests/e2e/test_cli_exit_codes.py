"""``hangwatch diagnose`` and ``status`` exit codes against a real monitor, one request per monitor.

The jobs are reports posted to the monitor (no training needed): a healthy one and one whose
rank 1 exited. Alarms are published at once (HANGWATCH_CONFIRM_ALARMS=0) so the verdict is there
at the first read.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hangwatch.cli import EXIT_ALARM, EXIT_OK, EXIT_UNKNOWN_JOB, EXIT_UNREACHABLE
from hangwatch.demo.harness import free_port
from tests.monitor.monitor_reports import rank, report
from tests.monitor.real_monitor import RunningMonitor, running_monitor

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

HANGWATCH = [sys.executable, "-m", "hangwatch.cli"]
REPORTS = "/api/v1/reports"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HANGWATCH, *args], capture_output=True, text=True, timeout=60)


def post_jobs(monitor: RunningMonitor, *, exited: bool) -> None:
    ranks = [rank(job_id="job-ok", rank=0), rank(job_id="job-ok", rank=1)]
    if exited:
        gone = rank(job_id="job-bad", rank=1, alive=False, pid=2001, cpu_percent=None,
                    exit={"at": time.time(), "code": 1, "source": "proc"})
        ranks += [rank(job_id="job-bad", rank=0), gone]
    assert httpx.post(monitor.base + REPORTS, json=report(ranks=ranks), timeout=5).status_code == 202


def wait_for(monitor: RunningMonitor, job_id: str, verdict: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        answer = httpx.get(monitor.base + "/diagnose", params={"format": "json", "job": job_id}, timeout=5).json()
        last = [j["verdict"] for j in answer["jobs"]]
        if last == [verdict]:
            return
        time.sleep(0.2)
    raise AssertionError(f"{job_id}: {last}, never {verdict}")


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[RunningMonitor]:
    # Debug: the access log, one line per request (counted below).
    with running_monitor(tmp_path, "--log-level", "debug", extra_env={"HANGWATCH_CONFIRM_ALARMS": "0"}) as m:
        yield m


@pytest.mark.parametrize("cmd", ["diagnose", "status"])
def test_each_exit_code(cmd: str, monitor: RunningMonitor) -> None:
    at = ("--monitor", monitor.base)
    assert run(cmd, *at).returncode == EXIT_OK  # no job at all

    post_jobs(monitor, exited=False)
    wait_for(monitor, "job-ok", "healthy")
    res = run(cmd, *at)
    assert res.returncode == EXIT_OK and "job-ok" in res.stdout, res

    post_jobs(monitor, exited=True)
    wait_for(monitor, "job-bad", "rank_exited")
    res = run(cmd, *at)
    assert res.returncode == EXIT_ALARM and "RANK_EXITED" in res.stdout, res
    res = run(cmd, *at, "--job", "job-ok")  # only the job asked about counts
    assert res.returncode == EXIT_OK and "job-bad" not in res.stdout, res

    unknown = run(cmd, *at, "--job", "no-such-job")
    assert unknown.returncode == EXIT_UNKNOWN_JOB, unknown
    assert unknown.stdout == "" and unknown.stderr.startswith("hangwatch: no job 'no-such-job'"), unknown

    gone = run(cmd, "--monitor", f"http://127.0.0.1:{free_port()}")
    assert gone.returncode == EXIT_UNREACHABLE and "unreachable" in gone.stderr, gone
    # An unreachable monitor among several: still unreachable, not "unknown job".
    gone = run(cmd, *at, "--monitor", f"http://127.0.0.1:{free_port()}", "--job", "no-such-job")
    assert gone.returncode == EXIT_UNREACHABLE, gone
    assert len({EXIT_OK, EXIT_ALARM, EXIT_UNREACHABLE, EXIT_UNKNOWN_JOB}) == 4


def _diagnose_requests(monitor: RunningMonitor) -> int:
    return sum('"GET /diagnose' in line for line in monitor.log_text().splitlines())


@pytest.mark.parametrize("args", [["diagnose"], ["diagnose", "--job", "job-bad"], ["diagnose", "--json"],
                                  ["status"], ["status", "--job", "job-bad"]])
def test_one_request_per_monitor(args: list[str], tmp_path: Path) -> None:
    env = {"HANGWATCH_CONFIRM_ALARMS": "0"}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with running_monitor(tmp_path / "a", "--log-level", "debug", extra_env=env) as a, \
            running_monitor(tmp_path / "b", "--log-level", "debug", extra_env=env) as b:
        post_jobs(a, exited=True)
        wait_for(a, "job-bad", "rank_exited")
        before = (_diagnose_requests(a), _diagnose_requests(b))
        res = run(*args, "--monitor", a.base, "--monitor", b.base)
        assert res.returncode == EXIT_ALARM and "job-bad" in res.stdout, res
        deadline = time.monotonic() + 5  # the access log line may land a moment after the answer
        while (_diagnose_requests(a) - before[0], _diagnose_requests(b) - before[1]) != (1, 1) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (_diagnose_requests(a) - before[0], _diagnose_requests(b) - before[1]) == (1, 1)
        if args[0] == "status":
            assert "MONITOR" in res.stdout.splitlines()[0] and a.base in res.stdout


@pytest.mark.parametrize("cmd", ["diagnose", "status"])
def test_help_lists_the_exit_codes(cmd: str) -> None:
    res = run(cmd, "--help")
    assert res.returncode == 0
    codes = res.stdout[res.stdout.index("exit codes:"):]
    for code in (EXIT_OK, EXIT_ALARM, EXIT_UNREACHABLE, EXIT_UNKNOWN_JOB):
        assert f"\n  {code}  " in codes, codes
    assert "--job names a job that no monitor knows" in codes


class _OddAnswers(http.server.BaseHTTPRequestHandler):
    """Answers /diagnose with whatever the test put in ``body``: a monitor of another version, or
    something that is not a monitor at all."""

    body = b"{}"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("cmd", ["diagnose", "status"])
@pytest.mark.parametrize("body", [
    b'[1, 2]',                                                      # JSON, not an answer
    b'{"jobs": [{"job_id": 5}]}',                                   # jobs without their fields
    b'{"jobs": [{"job_id": "j", "verdict": "deadlock", "ranks": 7}]}',  # fields of the wrong kind
    b'{"jobs": [{"job_id": "j", "verdict": "deadlock", "evidence": 3, "culprit_ranks": null}]}',
])
def test_an_answer_it_cannot_read_is_one_line_and_exit_2(cmd: str, body: bytes) -> None:
    handler = type("Handler", (_OddAnswers,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        res = run(cmd, "--monitor", f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert res.returncode == EXIT_UNREACHABLE, res
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "cannot read" in res.stderr, res.stderr
