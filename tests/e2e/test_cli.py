"""The ``hangwatch`` command: bad options, diagnose/status exit codes, and the live demo."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import psutil
import pytest

from hangwatch.harness import free_port, tool

HANGWATCH = [sys.executable, "-m", "hangwatch.cli"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*HANGWATCH, *args], capture_output=True, text=True, timeout=timeout)


def run_on_tty(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Run with stdout on a real pseudo-terminal, as a person at a terminal would."""
    import os
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
])
def test_bad_options_one_line_exit_2(argv):
    res = run(*argv)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangwatch"), res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("cmd", ["diagnose", "status"])
def test_unreachable_monitor_exit_2(cmd):
    res = run(cmd, "--monitor", f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 2
    assert "unreachable" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_diagnose_and_status_exit_codes(torchrun_job, wait_for_verdict, monitor):
    job = torchrun_job("--fail", "linger", "--fail-at-step", "30")
    job.wait_for_step(10, timeout=45)
    wait_for_verdict(job, "healthy")
    res = run("diagnose", "--monitor", monitor.url, "--job", job.job_id)
    assert res.returncode == 0, res
    assert job.job_id in res.stdout and "HEALTHY" in res.stdout.upper()

    wait_for_verdict(job, "deadlock", culprits=[1])
    res = run("diagnose", "--monitor", monitor.url, "--job", job.job_id)
    assert res.returncode == 1, res
    assert "DEADLOCK" in res.stdout.upper()
    res = run("diagnose", "--monitor", monitor.url, "--job", job.job_id, "--json")
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert [j["verdict"] for j in data["jobs"]] == ["deadlock"]
    assert data["jobs"][0]["culprit_ranks"] == [1]
    res = run("status", "--monitor", monitor.url, "--job", job.job_id)
    assert res.returncode == 1
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and job.job_id in lines[0] and "DEADLOCK" in lines[0]
    # Plain when piped, coloured on a terminal.
    assert "\033[" not in res.stdout
    for cmd in ("status", "diagnose"):
        code, shown = run_on_tty(cmd, "--monitor", monitor.url, "--job", job.job_id)
        assert code == 1 and "\033[1;31mDEADLOCK" in shown, shown
    res = run("diagnose", "--monitor", monitor.url, "--job", "no-such-job:1")
    assert res.returncode == 2 and "no job" in res.stderr


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


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_sharded_monitors_one_job_each_place_and_one_view(reaper, tmp_path):
    """An agent given two monitors sends a real job to its owner only; the CLI shows both monitors' jobs."""
    from agent.shards import owner
    from hangwatch.harness import MonitorClient, launch_torchrun, start_agent, start_monitor

    monitors = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monitors.append(start_monitor(reaper, tmp_path / name))
    urls = [m.url for m in monitors]
    port = free_port()
    job_id = f"127.0.0.1:{port}"
    start_agent(reaper, tmp_path, urls[0], extra=["--monitor", urls[1], "--job", job_id])
    launch_torchrun(reaper, tmp_path, ["--steps", "100000"], port=port)
    home = MonitorClient(owner(job_id, urls))
    other = MonitorClient(next(u for u in urls if u != owner(job_id, urls)))
    try:
        deadline = time.monotonic() + 90
        found = None
        while time.monotonic() < deadline:
            found = home.job(job_id)
            if found and found["verdict"] == "healthy" and len(found["ranks"]) == 2:
                break
            time.sleep(0.5)
        assert found and found["verdict"] == "healthy" and len(found["ranks"]) == 2, found
        assert other.job(job_id) is None  # the other monitor never got the job's ranks
    finally:
        home.close()
        other.close()

    res = run("status", "--monitor", urls[0], "--monitor", urls[1], "--job", job_id)
    assert res.returncode == 0, res
    assert job_id in res.stdout and "HEALTHY" in res.stdout
    res = run("diagnose", "--monitor", urls[0], "--monitor", urls[1], "--json")
    assert [j["job_id"] for j in json.loads(res.stdout)["jobs"]] == [job_id]
    res = run("diagnose", "--monitor", urls[0], "--monitor", f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 2 and "unreachable" in res.stderr
