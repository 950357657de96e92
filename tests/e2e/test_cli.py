"""The ``hangwatch`` command: bad options, --version and --help of every command, diagnose/status
exit codes, and the live demo (its status page kept up with --linger)."""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from hangwatch.demo.harness import free_port, tool
from hangwatch_common.version import version

HANGWATCH = [sys.executable, "-m", "hangwatch.cli"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*HANGWATCH, *args], capture_output=True, text=True, timeout=timeout)


def run_on_tty(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Run with stdout on a real pseudo-terminal, as a person at a terminal would."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([*HANGWATCH, *args], stdout=follower, stderr=subprocess.DEVNULL,
                                env={k: v for k, v in os.environ.items() if k != "NO_COLOR"})
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(leader)


def test_console_script_is_installed():
    assert tool("hangwatch")


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["demo"],
    ["demo", "no-such-case"],
    ["demo", "deadlock", "--timeout", "-1"],
    ["diagnose", "--monitor", "not-a-url"],
    ["diagnose", "--bogus"],
    ["status", "--monitor"],
    ["status", "--timeout", "0"],
    ["demo", "deadlock", "--port", "0"],
    ["demo", "deadlock", "--port", "http"],
])
def test_bad_options_one_line_exit_2(argv):
    res = run(*argv)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangwatch"), res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("program", ["hangwatch", "hangwatch-agent", "hangwatch-monitor"])
def test_version_on_every_command(program):
    res = subprocess.run([tool(program), "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res
    assert res.stdout.startswith(f"{program} {version()} (Python "), res.stdout


# Options whose help says what happens when they are not given, in words.
SAID_IN_WORDS = {"--node": "hostname", "--step-regex": "built-in", "--py-spy": "PATH", "--job": "every job",
                 "--dump-other-users": "HANGWATCH_DUMP_OTHER_USERS", "--nccl-ras-addr": "NCCL_RAS_ADDR",
                 "--token-file": "HANGWATCH_TOKEN_FILE", "--ca-file": "HANGWATCH_CA_FILE",
                 "--outage-journal": "HANGWATCH_OUTAGE_JOURNAL"}


def test_agent_help_shows_every_default():
    from agent.cli import build_parser

    res = subprocess.run([tool("hangwatch-agent"), "--help"], capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res
    # One entry per option: its line and the help lines under it, joined.
    entries = re.split(r"\n(?=  -)", res.stdout)
    for action in build_parser()._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        option = action.option_strings[0]
        (entry,) = [e for e in entries if e.split()[0].rstrip(",") == action.option_strings[0]]
        line = " ".join(entry.split())
        if option in SAID_IN_WORDS:
            assert "default" in line.lower() and SAID_IN_WORDS[option] in line, line
        elif action.default not in (None, [], argparse.SUPPRESS) and action.default is not False:
            assert f"(default: {action.default})" in line, line
        assert "(default: None)" not in line and "(default: [])" not in line and "(default: False)" not in line


@pytest.mark.parametrize("cmd", ["diagnose", "status"])
def test_unreachable_monitor_exit_2(cmd):
    res = run(cmd, "--monitor", f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 2
    assert "unreachable" in res.stderr and "Traceback" not in res.stderr


# diagnose/status exit codes on a real hang (0 healthy, 1 an alarm, 3 no such job): asked of the job
# tests/e2e/test_verdicts.py::test_no_alarm_before_the_stall watches, healthy and then deadlocked.


def test_demo_refuses_a_port_in_use_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = run("demo", "deadlock", "--port", str(port))
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr.strip() == (f"hangwatch: error: --port {port} is in use: pick another, or leave --port out "
                                  "for a free one"), res.stderr


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_demo_killed_shows_verdict_and_cleans_up():
    res = run("demo", "killed", "--linger", "0", "--timeout", "60", timeout=140)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "verdict now: rank_exited culprits [1]" in out
    assert "final /diagnose:" in out
    agent_pid = int(re.search(r"agent pid (\d+)", out).group(1))
    rank_pid = int(re.search(r"sent SIGKILL to rank 1 \(pid (\d+)\)", out).group(1))
    port = int(re.search(r"monitor on http://127\.0\.0\.1:(\d+)", out).group(1))
    assert not psutil.pid_exists(agent_pid) or psutil.Process(agent_pid).status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(rank_pid) or psutil.Process(rank_pid).status() == psutil.STATUS_ZOMBIE
    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert port not in listening
    # The monitor is gone, so what comes next is the same demo kept up on the same port, then the
    # commands that ask it: the console script by its absolute path, the monitor by its URL.
    after = out[out.index("cleaned up:"):].splitlines()
    assert "next: run the demo again with its monitor kept up" in after[1], after
    commands = [line.strip() for line in after[2:]]
    hangwatch = tool("hangwatch")
    at = f"HANGWATCH_MONITOR=http://127.0.0.1:{port}"
    assert commands == [f"{hangwatch} demo killed --linger --port {port}", f"{at} {hangwatch} diagnose",
                        f"{at} {hangwatch} status", f"curl -s http://127.0.0.1:{port}/diagnose"], after


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_sharded_monitors_one_job_each_place_and_one_view(reaper, tmp_path):
    """An agent given two monitors sends a real job to its owner only; the CLI shows both monitors' jobs."""
    from agent.shards import owner
    from hangwatch.demo.harness import launch_plain, start_agent, start_monitor

    monitors = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monitors.append(start_monitor(reaper, tmp_path / name))
    urls = [m.url for m in monitors]
    port = free_port()
    job_id = f"127.0.0.1:{port}"
    start_agent(reaper, tmp_path, urls[0], extra=["--monitor", urls[1], "--job", job_id])
    launch_plain(reaper, tmp_path, ["--steps", "100000"], port=port)
    home = owner(job_id, urls)
    other = next(u for u in urls if u != home)
    deadline = time.monotonic() + 90
    found = None
    while time.monotonic() < deadline:
        status, jobs = _jobs_at(home, job_id)  # 404 until the agent's first report of the job
        found = jobs[0] if status == 200 and jobs else None
        if found and found["verdict"] == "healthy" and len(found["ranks"]) == 2:
            break
        time.sleep(0.5)
    assert found and found["verdict"] == "healthy" and len(found["ranks"]) == 2, found
    assert _jobs_at(other, job_id) == (404, [])  # the other monitor never got the job's ranks

    res = run("status", "--monitor", urls[0], "--monitor", urls[1], "--job", job_id)
    assert res.returncode == 0, res
    assert job_id in res.stdout and "HEALTHY" in res.stdout
    res = run("diagnose", "--monitor", urls[0], "--monitor", urls[1], "--json")
    assert [j["job_id"] for j in json.loads(res.stdout)["jobs"]] == [job_id]
    res = run("diagnose", "--monitor", urls[0], "--monitor", f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 2 and "unreachable" in res.stderr


def _jobs_at(url: str, job_id: str) -> tuple[int, list[dict]]:
    answer = httpx.get(url + "/diagnose", params={"format": "json", "job": job_id}, timeout=10)
    return answer.status_code, answer.json()["jobs"]


def _lines_of(proc: subprocess.Popen) -> tuple[queue.Queue, threading.Thread]:
    """The process's output lines as they come (a thread reads them, so a wait can have a deadline)."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def _wait_for_line(lines: queue.Queue, pattern: str, timeout: float, seen: list[str]) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)}")


def _as_a_person_would(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` run by a shell, as pasted into a terminal elsewhere: another directory, no
    HANGWATCH_MONITOR of its own, and no venv on PATH (only what the line itself says)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGWATCH_") and k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_demo_serves_its_status_page_and_lingers_until_ctrl_c(tmp_path):
    port = free_port()
    # Started with SIGINT ignored, as a shell starts a background command (and as this test's worker
    # may be started): Ctrl-C must still end the demo.
    demo = subprocess.Popen([*HANGWATCH, "demo", "killed", "--timeout", "60", "--linger", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    seen: list[str] = []
    lines, reader = _lines_of(demo)
    try:
        page = _wait_for_line(lines, r"status page: (http://127\.0\.0\.1:\d+/) ", 60, seen).group(1)
        assert page == f"http://127.0.0.1:{port}/"
        # Printed before the job starts: the page is there to open while the job goes wrong.
        job_id = _wait_for_line(lines, r"job (127\.0\.0\.1:\d+)$", 60, seen).group(1)
        answer = httpx.get(page, timeout=10)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")

        _wait_for_line(lines, r"lingering until Ctrl-C", 120, seen)
        assert httpx.get(page, timeout=10).status_code == 200
        jobs = httpx.get(page + "diagnose", params={"format": "json", "job": job_id}, timeout=10).json()["jobs"]
        assert [j["verdict"] for j in jobs] == ["rank_exited"], jobs

        # The next commands, printed while the monitor is up, answer from it when run as printed.
        _wait_for_line(lines, r"ask the demo's monitor yourself, from another terminal, while it lingers:$", 10, seen)
        commands = [_wait_for_line(lines, r"^    (\S.*)$", 10, seen).group(1) for _ in range(3)]
        url = page.rstrip("/")
        hangwatch = tool("hangwatch")
        assert Path(hangwatch).is_absolute()
        assert commands == [f"HANGWATCH_MONITOR={url} {hangwatch} diagnose", f"HANGWATCH_MONITOR={url} {hangwatch} status",
                            f"curl -s {url}/diagnose"], commands
        diagnose, status, curl = (_as_a_person_would(c, tmp_path) for c in commands)
        assert diagnose.returncode == 1 and f"JOB {job_id}  RANK_EXITED" in diagnose.stdout, diagnose  # 1: an alarm
        assert status.returncode == 1 and status.stdout.splitlines()[1].split()[:2] == [job_id, "RANK_EXITED"], status
        assert curl.returncode == 0 and f"JOB {job_id}  RANK_EXITED" in curl.stdout, curl

        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0, "".join(seen)
        _wait_for_line(lines, r"cleaned up: every process the demo started is gone", 10, seen)
        with pytest.raises(httpx.TransportError):
            httpx.get(page, timeout=5)
    finally:
        if demo.poll() is None:  # the test failed early: let the demo clean up after itself
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(timeout=30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait(timeout=10)
        reader.join(timeout=10)
        demo.stdout.close()
