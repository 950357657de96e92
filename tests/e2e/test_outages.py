"""A monitor outage loses nothing: the real agent keeps what changed and delivers it when the
monitor is back, and the job's history shows it at the times it happened.

The session's monitor is killed (SIGKILL) for OUTAGE_S while a rank of one job exits and a
rank of another leaves the loop and lingers (its peer deadlocks in all_reduce); it is then
restarted on the same port and database. And the other way round: the agent falls silent
(SIGSTOP) under a healthy job, which must turn unknown, never an alarm from old data.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from urllib.parse import urlsplit

import httpx
import pytest

from hangwatch.demo.harness import STALL_MARKER, MonitorClient, Observation, Reaper, Service, start_monitor, tool

# 20 s covers the same path as minutes: the agent's retry backoff is capped at 4 s (agent/sender.py), so it
# retries at its cap for most of the outage either way. benchmarks/README.md runs it for 2 and 10 minutes.
OUTAGE_S = float(os.environ.get("HANGWATCH_TEST_OUTAGE_S", "20"))

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(OUTAGE_S + 300)]
# Late enough that both jobs are seen healthy before the outage starts, early in it.
FAIL_AT = ("--fail-at-step", "200", "--step-sleep", "0.1")


def _change(history: list[dict], verdict: str) -> dict:
    found = [h for h in history if h["verdict"] == verdict]
    assert found, f"no {verdict} in the history: {history}"
    return found[0]


def _evidence(history: list[dict], happened_at: float, back: float, agent: Service, monitor: Service) -> str:
    """What a failure needs to be understood from CI's output alone: the whole history (times
    relative to the fault), what the agent said about the outage and the ranks, and what the
    restarted monitor did with the replayed reports (taken, dropped as too old, refused and why)."""
    changes = [f"{h['at'] - happened_at:+.1f}s {h['verdict']} {h['culprit_ranks']}: {h['summary']}" for h in history]
    agent_lines = agent.log.read_text(errors="replace").splitlines()[-15:]
    try:
        exposition = httpx.get(monitor.url + "/metrics", timeout=10).text.splitlines()
    except httpx.HTTPError as exc:
        exposition = [f"(no /metrics: {exc})"]
    counters = [line for line in exposition if line.startswith(
        ("hangwatch_monitor_reports_replay", "hangwatch_reports_rejected"))]
    return "\n".join([f"restart at {back - happened_at:+.1f}s from the fault; history:", *changes,
                      "agent log:", *agent_lines, "monitor's replay and refusal counters:", *counters,
                      "monitor log:", monitor.log_tail(15)])


def test_a_rank_that_exits_and_one_that_stalls_during_an_outage_reach_the_history(
        monitor: Service, agent: Service, client: MonitorClient, session_reaper: Reaper, e2e_dir,
        plain_job, wait_for_verdict) -> None:
    exits = plain_job("--fail", "exit", *FAIL_AT)
    lingers = plain_job("--fail", "linger", *FAIL_AT)
    wait_for_verdict(exits, "healthy")
    wait_for_verdict(lingers, "healthy")

    session_reaper.kill(monitor.proc.pid)
    monitor.proc.wait(timeout=10)
    outage_started = time.time()
    exits.wait_for(STALL_MARKER, timeout=90)
    lingers.wait_for(STALL_MARKER, timeout=90)
    exited_at, lingered_at = exits.stall_time(), lingers.stall_time()
    assert exited_at is not None and lingered_at is not None
    assert exited_at > outage_started and lingered_at > outage_started, "the jobs failed before the outage"
    # The outage lasts OUTAGE_S, and at least 20 s past the last failure (a slow machine).
    time.sleep(max(0.0, outage_started + OUTAGE_S - time.time(), max(exited_at, lingered_at) + 20 - time.time()))

    restarted = start_monitor(session_reaper, e2e_dir, port=urlsplit(monitor.url).port)
    monitor.proc, monitor.log = restarted.proc, restarted.log  # the session's monitor from here on
    back = time.time()
    seen: list[Observation] = []
    wait_for_verdict(exits, "rank_exited", culprits=[1], timeout=30, observations=seen)
    wait_for_verdict(lingers, "deadlock", culprits=[1], timeout=30, observations=seen)
    right_after_s = time.time() - back
    # Until the agent's news arrives the restarted monitor says it is refreshing: it never calls
    # the jobs healthy (or anything else) from the picture it had before the outage.
    unexpected = [o for o in seen if o.verdict not in (None, "unknown", "rank_exited", "deadlock")]
    assert not unexpected, "\n".join(
        [f"{o.at - back:+.1f}s after the restart: {o.job_id} {o.verdict} {list(o.culprits)}: {o.summary}"
         for o in unexpected[:5]] + ["monitor log:", monitor.log_tail(20)])

    exit_history = client.history(exits.job_id) or []
    exit_change = _change(exit_history, "rank_exited")
    assert exit_change["culprit_ranks"] == [1]
    assert exited_at - 1 <= exit_change["at"] <= exited_at + 8, _evidence(exit_history, exited_at, back, agent, monitor)
    linger_history = client.history(lingers.job_id) or []
    deadlock_change = _change(linger_history, "deadlock")
    assert lingered_at <= deadlock_change["at"] < back, _evidence(linger_history, lingered_at, back, agent, monitor)
    assert deadlock_change["at"] - lingered_at < 30, _evidence(linger_history, lingered_at, back, agent, monitor)
    # Both incidents named a rank on the agent's node: it is a suspect with the two jobs, read by
    # `hangwatch nodes` from the history the restarted monitor keeps.
    node = client.job(lingers.job_id)["ranks"][0]["node"]
    listed = subprocess.run([tool("hangwatch"), "nodes", "--monitor", monitor.url, "--json"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    suspects = {n["node"]: n for n in json.loads(listed.stdout)["nodes"]}
    assert node in suspects, listed.stdout
    assert {exits.job_id, lingers.job_id} <= set(suspects[node]["jobs"]), listed.stdout
    assert {"rank_exited", "deadlock"} <= set(suspects[node]["verdicts"]), listed.stdout
    print(f"outage {OUTAGE_S:.0f}s: verdicts right {right_after_s:.1f}s after the restart; "
          f"exit recorded {exit_change['at'] - exited_at:+.1f}s, deadlock {deadlock_change['at'] - lingered_at:+.1f}s "
          "from when they happened")


def test_a_silent_agent_makes_its_job_unknown_and_never_raises_an_alarm(
        agent: Service, torchrun_job, wait_for_verdict) -> None:
    job = torchrun_job("--steps", "100000")
    wait_for_verdict(job, "healthy", where=lambda j: len(j["ranks"]) == 2 and j["job_step"] is not None)
    os.kill(agent.proc.pid, signal.SIGSTOP)  # the agent alive but silent, as when its node hangs
    seen: list[Observation] = []
    try:
        wait_for_verdict(job, "unknown", timeout=30, observations=seen, where=lambda j: "silent" in j["summary"])
        deadline = time.monotonic() + 20  # and it stays so: old data never turns into an alarm
        while time.monotonic() < deadline:
            wait_for_verdict(job, "unknown", timeout=10, observations=seen)
            time.sleep(1)
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    assert {o.verdict for o in seen} <= {"healthy", "unknown"}, seen
    wait_for_verdict(job, "healthy", timeout=30)
