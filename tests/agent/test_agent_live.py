"""The real agent against real processes: discovery, CPU, logs, py-spy, exits, stops, sending."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from monitor.ingest.wire import Report
from tests.agent.conftest import agent_argv, children_of, run_agent_once
from tests.notify_socket import NotifySocket

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)


def _by_rank(report: dict, job: str) -> dict[int, dict]:
    return {r["rank"]: r for r in report["ranks"] if r["job_id"] == job}


@pytest.mark.cpu_bound
def test_once_discovers_samples_follows_logs_and_dumps_stacks(ranks):
    busy = ranks.start(0, "busy")
    idle = ranks.start(1, "with-child")
    child_pid = int(ranks.wait_for_line(1, "child ").split()[1])
    ranks.extra_pids.append(child_pid)
    ranks.wait_for_line(0, "step 2")
    ranks.wait_for_line(1, "step 2")

    report = run_agent_once("--interval", "0.5", "--job", ranks.job, "--node", "test-node")
    Report.model_validate(report)  # the contract with the monitor

    found = _by_rank(report, ranks.job)
    assert sorted(found) == [0, 1]
    assert found[0]["pid"] == busy.pid and found[1]["pid"] == idle.pid
    assert child_pid not in {r["pid"] for r in report["ranks"]}  # the helper inheriting RANK
    assert found[0]["launcher"] == "env" and found[1]["world_size"] == 2

    assert found[0]["cpu_percent"] > 25, found[0]["cpu_percent"]  # 2 shared cores in CI: not 100
    assert found[1]["cpu_percent"] < 10, found[1]["cpu_percent"]
    assert found[0]["threads"]["total"] >= 1 and found[0]["rss_bytes"] > 1_000_000
    assert found[0]["wchar"] > 0

    for rank in (0, 1):
        progress = found[rank]["progress"]
        assert progress["scope"] == "rank" and progress["pattern"] == "generic"
        assert progress["step"] >= 2 and progress["source"] == str(ranks.log_path(rank))

    stack = found[1]["stack"]
    assert found[1]["stack_error"] is None and stack["duration_s"] < 5
    main = stack["threads"][0]
    assert main["tid"] == idle.pid and main["name"] == "MainThread"
    assert any(f["file"] == str(ranks.script) for f in main["frames"])
    assert report["agent"]["py_spy"] == "ok"
    assert all(c["ok"] for c in report["collectors"]), report["collectors"]


def test_stopped_rank_reported_as_T_and_not_dumped(ranks):
    proc = ranks.start(0, "sleep", world_size=1)
    ranks.wait_for_line(0, "step 1")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        report = run_agent_once("--interval", "0.3", "--job", ranks.job)
        rank = _by_rank(report, ranks.job)[0]
        assert rank["state"] == "T" and rank["alive"] is True
        assert rank["stack"] is None and rank["stack_error"] is None
        assert rank["cpu_percent"] == 0.0
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    time.sleep(0.2)
    with open(f"/proc/{proc.pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] in "RS"  # the agent left it running


def test_missing_py_spy_is_reported_not_fatal(ranks):
    ranks.start(0, "sleep", world_size=1)
    ranks.wait_for_line(0, "step 1")
    report = run_agent_once("--interval", "0.2", "--job", ranks.job, "--py-spy", "/nonexistent/py-spy")
    Report.model_validate(report)
    assert "not found" in report["agent"]["py_spy"]
    rank = _by_rank(report, ranks.job)[0]
    assert rank["stack"] is None and "not found" in rank["stack_error"]
    health = {c["name"]: c for c in report["collectors"]}
    assert health["stacks"]["ok"] is False and health["procstat"]["ok"] is True


def test_loop_reports_exits_with_code_signal_and_order(ranks, receiver, agent_process, tmp_path):
    agent = agent_process(
        "--monitor", receiver.url, "--interval", "0.2", "--job", ranks.job, "--no-stacks", "--node", "n1"
    )
    cue = tmp_path / "rank1-exits"
    ranks.start(0, "sleep", world_size=3)
    ranks.start(1, "sleep", world_size=3, EXIT_WHEN=cue, EXIT_CODE=3)
    killed = ranks.start(2, "sleep", world_size=3)
    # All three seen alive, rank 1 past step 5 (on a loaded machine that takes longer than any fixed time).
    receiver.wait_for(lambda r: len(found := _by_rank(r, ranks.job)) == 3 and all(x["alive"] for x in found.values())
                      and (found[1].get("progress") or {}).get("step", 0) >= 5)
    os.kill(killed.pid, signal.SIGKILL)  # killed first: it must be the earliest exit
    cue.touch()
    # Do not reap yet: the agent reads the zombie's status. (Popen only reaps on poll/wait.)
    report = receiver.wait_for(
        lambda r: all(not x["alive"] for k, x in _by_rank(r, ranks.job).items() if k != 0)
    )
    Report.model_validate(report)
    found = _by_rank(report, ranks.job)
    assert found[0]["alive"] is True and found[0]["exit"] is None
    assert found[1]["exit"]["code"] == 3 and found[1]["exit"]["signal"] is None
    assert found[2]["exit"]["signal"] == 9 and found[2]["exit"]["code"] is None
    assert found[1]["exit"]["source"] == found[2]["exit"]["source"] == "proc"
    assert found[2]["exit"]["at"] < found[1]["exit"]["at"]
    assert found[1]["progress"]["step"] >= 5  # progress of a dead rank is still reported
    assert agent.poll() is None

    agent.send_signal(signal.SIGTERM)  # clean stop
    out, err = agent.communicate(timeout=10)
    assert agent.returncode == 0, err
    assert "Traceback" not in err


def test_agent_keeps_running_when_monitor_unreachable(agent_process):
    # A port nobody listens on: bind, read the number, close.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = agent_process("--monitor", f"http://127.0.0.1:{port}", "--interval", "0.1", "--no-stacks")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(agent.stderr), daemon=True)
    reader.start()
    # Its loop is running once it said the monitor is unreachable (a loaded machine starts it slowly).
    deadline = time.monotonic() + 60
    while not any("unreachable" in line for line in lines) and time.monotonic() < deadline:
        assert agent.poll() is None, "".join(lines)
        time.sleep(0.1)
    time.sleep(1.0)  # ten more sends that fail
    assert agent.poll() is None
    agent.send_signal(signal.SIGINT)
    agent.wait(timeout=10)
    reader.join(timeout=10)
    err = "".join(lines)
    assert agent.returncode == 0, err
    assert err.count("unreachable") == 1, err  # logged once, not every retry
    assert "Traceback" not in err


def test_own_pid_namespace_leaves_other_namespaces_alone(tmp_path):
    """A rank in another PID namespace (a container, a simulated node) is skipped on request."""
    script = "import time; print('step 1', flush=True); time.sleep(60)"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "45999"}
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", script],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        job = "127.0.0.1:45999"
        deadline = time.monotonic() + 15
        while True:
            seen = run_agent_once("--job", job, "--no-stacks")
            if seen["ranks"] or time.monotonic() > deadline:
                break
        assert [r["job_id"] for r in seen["ranks"]] == [job]
        assert run_agent_once("--job", job, "--no-stacks", "--own-pid-namespace")["ranks"] == []
    finally:
        proc.kill()  # --kill-child: the namespace's init dies with unshare
        proc.wait(timeout=10)


def test_agent_tells_systemd_it_is_ready_and_alive(tmp_path, monkeypatch):
    """Under a Type=notify unit: READY=1 after the first scan, WATCHDOG=1 from the sampling loop."""
    notify = NotifySocket(tmp_path / "notify.sock")
    for name, value in notify.env(400_000).items():
        monkeypatch.setenv(name, value)
    proc = subprocess.Popen(agent_argv("--monitor", "http://127.0.0.1:9", "--interval", "0.1", "--no-stacks"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        messages = notify.wait_until(lambda ms: sum("WATCHDOG=1" in m for m in ms) >= 3)
        ready = [m for m in messages if "READY=1" in m]
        assert len(ready) == 1 and f"MAINPID={proc.pid}" in ready[0] and "watching" in ready[0]
        proc.send_signal(signal.SIGTERM)
        notify.wait_until(lambda ms: any("STOPPING=1" in m for m in ms))
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        notify.close()


@pytest.mark.parametrize(
    "args",
    [
        ["--monitor", "not-a-url"],
        ["--monitor", "ftp://host/"],
        ["--monitor", "http://127.0.0.1:9", "--interval", "0"],
        ["--monitor", "http://127.0.0.1:9", "--interval", "-1"],
        ["--monitor", "http://127.0.0.1:9", "--interval", "nan"],
        ["--monitor", "http://127.0.0.1:9", "--step-regex", "("],
        ["--monitor", "http://127.0.0.1:9", "--step-regex", "step \\d+"],
        ["--monitor", "http://127.0.0.1:9", "--node", "bad name"],
        ["--monitor", "http://127.0.0.1:99999"],
        ["--bogus"],
        [],
    ],
)
def test_bad_options_exit_2_with_one_line(args):
    done = subprocess.run(agent_argv(*args), capture_output=True, text=True, timeout=20)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangwatch-agent: error:"), done.stderr


def test_real_torchrun_ranks_found_launcher_excluded(ranks, tmp_path):
    """torchrun itself (also a python process) is skipped; its workers are the ranks."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    log = open(tmp_path / "torchrun.log", "w")
    launcher = subprocess.Popen(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(ranks.port),
         str(ranks.script), "sleep"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()
    try:
        deadline = time.time() + 30
        while time.time() < deadline and (tmp_path / "torchrun.log").read_text().count("step 3") < 2:
            time.sleep(0.1)
        report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks")
        found = _by_rank(report, ranks.job)
        assert sorted(found) == [0, 1], (report["ranks"], (tmp_path / "torchrun.log").read_text()[-2000:])
        assert launcher.pid not in {r["pid"] for r in report["ranks"]}
        assert {r["launcher"] for r in found.values()} == {"torchrun"}
        assert {r["local_rank"] for r in found.values()} == {0, 1}
        # both ranks write unprefixed lines to the one shared file: the job's progress
        assert {r["progress"]["scope"] for r in found.values()} == {"job"}
    finally:
        # torchrun starts workers in their own sessions: kill its children by PID, then it.
        for pid in children_of(launcher.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.kill()
        launcher.wait(timeout=20)
