"""torch's own debug handlers end to end: a real gloo job run under torch's ``worker_main`` (each
rank's worker server on a unix socket it names itself, after it started), a real agent that
cannot use py-spy (as on a cluster that forbids ptrace), a real monitor. The stacks come from the
ranks' ``dump_traceback``, the live Flight Recorder from ``fr_trace_json``: the deadlock is named
with its culprit, the waiting rank's stack, and the collective (and its sequence number) the
culprit never entered."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangwatch.demo.harness import MonitorClient, Reaper, launch_torchrun, start_agent, start_monitor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_stacks_and_flight_recorder_from_torch_worker_servers_without_py_spy(reaper: Reaper, tmp_path: Path) -> None:
    monitor = start_monitor(reaper, tmp_path)
    agent = start_agent(reaper, tmp_path, monitor.url, extra=["--py-spy", str(tmp_path / "no-py-spy-here")])
    # Rank 0 issues one all_reduce more than rank 1 (which waits in the next step's broadcast).
    job = launch_torchrun(reaper, tmp_path, ["--worker-server", "--fail", "extra-collective", "--fail-rank", "0",
                                             "--extra-op", "broadcast", "--fail-at-step", "30"])
    client = MonitorClient(monitor.url)
    try:
        found = client.wait_for_verdict(
            job.job_id, "deadlock", 90,
            where=lambda j: any("Flight Recorder" in e for e in j["evidence"]) and all(
                r.get("top_frame") for r in j["ranks"]),
            context=lambda: f"agent log:\n{agent.log_tail(20)}\njob log:\n{job.log_tail()}")
    finally:
        client.close()
    assert found["culprit_ranks"] == [0], found["summary"]
    # py-spy could not run: every rank's stack came from its worker server.
    frames = {r["rank"]: r["top_frame"] for r in found["ranks"]}
    assert frames[0].startswith("broadcast") and frames[1].startswith("all_reduce"), frames
    flight = [e for e in found["evidence"] if "Flight Recorder" in e]
    assert any("disagree on collective #" in line and "rank 0 broadcast; rank 1 all_reduce" in line
               for line in flight), flight
