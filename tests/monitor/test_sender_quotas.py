"""One sender must not fill a real monitor for the others (issue 20): a node's share of the job
places, silent jobs giving their places to new ones at max_jobs, and the snapshot budget."""

from __future__ import annotations

import random
import sqlite3
import string
import time
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import running_monitor

pytestmark = pytest.mark.live  # real monitors
URL = "/api/v1/reports"


def _metric_line(base: str, prefix: str) -> str:
    lines = [line for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, (prefix, lines)
    return lines[0]


def _job_ids(base: str) -> set[str]:
    jobs = httpx.get(f"{base}/diagnose", params={"format": "json", "view": "summary"}, timeout=5).json()["jobs"]
    return {j["job_id"] for j in jobs}


def test_junk_cannot_lock_new_jobs_out(tmp_path: Path) -> None:
    """One node holds only its share of jobs, counted across its reports (issue 33: 2,000 jobs
    spread over reports of 63 once passed a per-report count); only the excess is refused, never
    the node's other jobs; junk sent once under many names fills the monitor, then gives its places
    to a real job once silent, while junk that keeps talking keeps its."""
    # Silent for 5 s: long enough that the greedy node's first jobs are not silent between its posts on a
    # loaded machine (2 s once let them go: the third post was taken), short enough to wait for below.
    env = {"HANGWATCH_MAX_JOBS": "10", "HANGWATCH_MAX_JOBS_PER_NODE": "4", "HANGWATCH_JOB_ROOM_SILENT_S": "5"}
    with running_monitor(tmp_path, extra_env=env) as monitor, httpx.Client(base_url=monitor.base, timeout=5) as http:
        def post(node: str, *jobs: str) -> httpx.Response:
            return http.post(URL, json=report(node=node, ranks=[rank(job_id=job, rank=0) for job in jobs]))

        assert post("greedy", "greedy-0", "greedy-1", "greedy-2").status_code == 202
        some = post("greedy", "greedy-3", "greedy-4", "greedy-5")
        assert some.status_code == 202 and some.json()["refused_jobs"]["jobs"] == ["greedy-4", "greedy-5"], some.text
        assert "max_jobs_per_node" in some.json()["refused_jobs"]["detail"]
        none = post("greedy", "greedy-6", "greedy-7", "greedy-8")
        assert none.status_code == 429 and "max_jobs_per_node" in none.json()["detail"], none.text
        assert {j for j in _job_ids(monitor.base) if j.startswith("greedy")} == {f"greedy-{i}" for i in range(4)}

        assert post("node-real", "job-real").status_code == 202
        assert [post(f"junk-{i}", f"junk-{i}").status_code for i in range(5)] == [202] * 5  # 10 jobs: full
        # A new job past max_jobs is refused alone: the node's live job is still taken.
        both = post("node-real", "job-real", "job-real-2")
        assert both.status_code == 202 and both.json()["refused_jobs"]["jobs"] == ["job-real-2"], both.text
        deadline = time.monotonic() + 30
        while True:
            assert post("junk-0", "junk-0").status_code == 202  # the one that keeps talking
            both = post("node-real", "job-real", "job-real-2")
            assert both.status_code == 202, both.text
            if "refused_jobs" not in both.json():
                break
            assert time.monotonic() < deadline, "the real job's new job never got a place"
            time.sleep(0.5)
        jobs = _job_ids(monitor.base)
        assert {"job-real", "job-real-2", "junk-0"} <= jobs and len(jobs) <= 10, jobs
        assert float(_metric_line(monitor.base, "hangwatch_monitor_jobs_displaced_total").split()[-1]) >= 1
        assert _metric_line(monitor.base, 'hangwatch_reports_rejected_total{reason="node_jobs"}').endswith(" 2.0")


def test_a_node_at_its_share_makes_room_with_its_own_ended_jobs(tmp_path: Path) -> None:
    """A node that runs many short jobs is not refused a new one for its finished ones."""
    env = {"HANGWATCH_MAX_JOBS_PER_NODE": "2", "HANGWATCH_JOB_ROOM_SILENT_S": "1"}
    with running_monitor(tmp_path, extra_env=env) as monitor, httpx.Client(base_url=monitor.base, timeout=5) as http:
        def post(*ranks: dict) -> httpx.Response:
            return http.post(URL, json=report(node="node-ci", ranks=list(ranks)))

        ended = {"alive": False, "exit": {"at": time.time(), "code": 0, "source": "proc"}}
        assert post(rank(job_id="short-0"), rank(job_id="short-1")).status_code == 202
        assert post(rank(job_id="short-0", **ended), rank(job_id="short-1", **ended)).status_code == 202
        deadline = time.monotonic() + 15
        while (answer := post(rank(job_id="short-2"))).status_code != 202:
            assert answer.status_code == 429 and time.monotonic() < deadline, answer.text
            time.sleep(0.3)
        assert "short-2" in _job_ids(monitor.base)


def test_junk_ranks_cannot_fill_the_monitor_and_give_their_room_once_silent(tmp_path: Path) -> None:
    """A report may list 4,096 ranks under any node name: all jobs' ranks together are bounded
    (max_ranks). Past it new ranks are refused, known ones still taken; junk that falls silent
    makes room, junk that keeps talking keeps its ranks."""
    env = {"HANGWATCH_MAX_RANKS": "40", "HANGWATCH_JOB_ROOM_SILENT_S": "2"}
    with running_monitor(tmp_path, extra_env=env) as monitor, httpx.Client(base_url=monitor.base, timeout=5) as http:
        def post(node: str, job: str, ranks: range) -> httpx.Response:
            return http.post(URL, json=report(node=node, ranks=[rank(job_id=job, rank=r, pid=1000 + r,
                                                                     world_size=64) for r in ranks]))

        assert post("node-real", "job-real", range(8)).status_code == 202
        assert post("junk-a", "junk-a", range(24)).status_code == 202
        assert post("junk-b", "junk-b", range(8)).status_code == 202  # 40: full
        refused = post("node-real-2", "job-real", range(8, 16))
        assert refused.status_code == 429 and "max_ranks" in refused.json()["detail"], refused.text
        assert post("node-real", "job-real", range(8)).status_code == 202  # ranks it holds: still taken
        deadline = time.monotonic() + 15
        while True:
            assert post("junk-b", "junk-b", range(8)).status_code == 202  # the junk that keeps talking
            assert post("node-real", "job-real", range(8)).status_code == 202
            status = post("node-real-2", "job-real", range(8, 16)).status_code
            if status == 202:
                break
            assert status == 429 and time.monotonic() < deadline, "the real ranks never got in"
            time.sleep(0.5)
        assert _job_ids(monitor.base) == {"job-real", "junk-b"}  # junk-a, silent, made the room
        assert _metric_line(monitor.base, 'hangwatch_reports_rejected_total{reason="too_many_ranks"}').split()[-1] != "0.0"


def _snapshot_bytes(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT node, SUM(length(body)) FROM snapshots GROUP BY node").fetchall())


def _noise(size: int, seed: int) -> str:
    """Text zlib cannot shrink much: a padded report's cost on disk."""
    rng = random.Random(seed)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size))


def test_snapshots_stay_within_their_budget_under_many_node_names(tmp_path: Path) -> None:
    budget, largest = 40_000, 8_000
    env = {"HANGWATCH_SNAPSHOT_BUDGET_BYTES": str(budget), "HANGWATCH_SNAPSHOT_MAX_BYTES": str(largest),
           "HANGWATCH_SNAPSHOT_INTERVAL_S": "0.2"}
    db = tmp_path / "state" / "monitor.db"
    with running_monitor(tmp_path, db=db, extra_env=env) as monitor, httpx.Client(base_url=monitor.base, timeout=5) as http:
        def post(node: str, lines: int, seed: int) -> int:
            errors = [_noise(2000, seed * 100 + i) for i in range(lines)]  # 1.5 KB each, compressed
            ranks = [rank(job_id=f"job-{node}", rank=0, log_errors=errors)]
            return http.post(URL, json=report(node=node, ranks=ranks)).status_code

        assert post("node-real", 0, 0) == 202
        assert post("padded", 6, 1) == 202  # taken, but its snapshot (about 9 KB) is not kept
        for i in range(20):  # about 4.5 KB each: the budget holds 8 of them
            assert post(f"junk-{i}", 3, 10 + i) == 202
        time.sleep(0.3)  # the real node's next snapshot is due: it replaces its own
        assert post("node-real", 0, 2) == 202

        def settled() -> dict[str, int] | None:
            stored = _snapshot_bytes(db)
            refused = _metric_line(monitor.base, 'hangwatch_monitor_snapshots_refused_total{reason="over_budget"}')
            return stored if float(refused.split()[-1]) > 0 and "node-real" in stored else None

        deadline = time.monotonic() + 10
        while (stored := settled()) is None:
            assert time.monotonic() < deadline, _snapshot_bytes(db)
            time.sleep(0.2)
        assert "padded" not in stored
        assert sum(stored.values()) <= budget + largest, stored
        assert _metric_line(monitor.base, 'hangwatch_monitor_snapshots_refused_total{reason="too_large"}').endswith(" 1.0")
        assert 0 < float(_metric_line(monitor.base, "hangwatch_monitor_snapshot_bytes").split()[-1]) <= budget + largest
