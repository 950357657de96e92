"""Evidence captured at the moment: a real gloo deadlock held past the monitor's capture delay
makes the real agent take native stacks, log tails (and Flight Recorder where recorded) of the
job's ranks and upload them; the bundle is listed on the job's history answer and downloads as
a tar a person can open after the job is gone."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from hangwatch.demo.harness import MonitorClient, Reaper, launch_torchrun, start_agent, start_monitor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _bundle(url: str, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    found: list[dict] = []
    while time.monotonic() < deadline:
        found = httpx.get(f"{url}/api/v1/captures", params={"job": job_id}, timeout=5).json()["captures"]
        if found and found[0]["nodes_received"] == found[0]["nodes_asked"]:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no complete capture after {timeout}s: {found}")


def test_a_held_deadlock_is_captured_and_the_bundle_downloads(reaper: Reaper, tmp_path: Path) -> None:
    monitor = start_monitor(reaper, tmp_path, settings={"HANGWATCH_CAPTURE_AFTER_S": "1"})
    agent = start_agent(reaper, tmp_path, monitor.url)
    job = launch_torchrun(reaper, tmp_path, ["--fail", "linger", "--fail-at-step", "40"])
    pids = job.rank_pids(timeout=30)
    client = MonitorClient(monitor.url)
    try:
        client.wait_for_verdict(job.job_id, "deadlock", 60, culprits=[1],
                                context=lambda: f"agent log:\n{agent.log_tail(20)}")
    finally:
        client.close()
    bundle = _bundle(monitor.url, job.job_id)
    assert bundle["nodes_asked"] == 1 and bundle["bytes"] > 0 and bundle["refused"] == {}, bundle
    assert bundle["verdict"] in ("deadlock", "stalled")
    history = httpx.get(f"{monitor.url}/api/v1/jobs/{job.job_id}/history", timeout=5).json()
    assert [c["id"] for c in history["captures"]] == [bundle["id"]]

    # The download: bundle.json and one gzipped part per node, whatever happens to the job now.
    reaper.kill(job.launcher.pid)
    tar_bytes = httpx.get(f"{monitor.url}{bundle['download']}", timeout=30).content
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        names = tar.getnames()
        meta = json.loads(tar.extractfile(f"{bundle['id']}/bundle.json").read())
        [part_name] = [n for n in names if n.endswith(".json.gz")]
        part = json.loads(gzip.decompress(tar.extractfile(part_name).read()))
    assert meta["job_id"] == job.job_id and set(meta["nodes"]) == set(meta["received"])
    ranks = {r["rank"]: r for r in part["ranks"]}
    assert set(ranks) == {0, 1} and {r["pid"] for r in ranks.values()} == set(pids.values())
    for r in ranks.values():
        assert r["errors"] == {}, r["errors"]
        # Native, or (py-spy's native unwinding fails now and then) Python frames with the failure said.
        assert r["stack"]["native"] is True or r["stack"]["native_error"], r["stack"]
        assert r["stack"]["threads"], r["stack"]
    waiting = [f["name"] for f in ranks[0]["stack"]["threads"][0]["frames"]]
    assert "all_reduce" in waiting, waiting
    lingering = [f["name"] for f in ranks[1]["stack"]["threads"][0]["frames"]]
    assert "linger_forever" in lingering, lingering
    assert any("leaving the training loop" in text or "waiting for the others" in text
               for text in ranks[1]["logs"].values()), ranks[1]["logs"]
