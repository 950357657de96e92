"""A flood of padded reports under ever new node names, against the real monitor: once it ends, the
monitor's memory falls back near where it was (issue 33: its RSS went from 62 to 1,008 MiB and
stayed, the junk jobs kept for the whole job retention and glibc keeping what was freed).

The monitor runs with a small silent budget (``HANGWATCH_MAX_SILENT_BYTES``) and a second of
silence (``HANGWATCH_JOB_ROOM_SILENT_S``) so that this takes seconds, not the minute of the
defaults; a real node reports throughout, as a cluster's agents do, and its job must stay.
"""

from __future__ import annotations

import random
import string
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from monitor_reports import rank, report
from real_monitor import running_monitor

pytestmark = pytest.mark.live  # starts the real monitor

URL = "/api/v1/reports"
MIB = 1024 * 1024
SILENT_BUDGET = 4 * MIB
# 250 junk jobs of 13 ranks, each rank keeping 10 error lines of 2 KB: ~100 MiB the monitor kept
# before (260 KB of text a report, and a rank's records beside it).
JUNK_REPORTS = 250
JUNK_RANKS = 13
# How far above its baseline the monitor may settle: the silent budget, the live node's job, and
# what the allocator keeps below its trimming threshold (monitor/web/heap_trim.py, 16 MiB).
SETTLED_ABOVE_BASELINE = 40 * MIB
SETTLE_WAIT_S = 12.0


def _junk(index: int, lines: list[str]) -> dict:
    ranks = [rank(job_id=f"junk-{index}", rank=k, world_size=JUNK_RANKS, log_errors=lines[k:k + 10])
             for k in range(JUNK_RANKS)]
    return report(node=f"junk-{index}", ranks=ranks)


def _keep_reporting(base: str, stop: threading.Event, statuses: list[int]) -> None:
    """One real node, every half second, numbered as an agent numbers its reports."""
    with httpx.Client(base_url=base, timeout=30) as http:
        seq = 1
        while not stop.is_set():
            body = report(node="node-live", ranks=[rank(job_id="job-live", world_size=1)], seq=seq)
            statuses.append(http.post(URL, json=body).status_code)
            seq += 1
            stop.wait(0.5)


def _flood(base: str, first: int, count: int, statuses: list[int]) -> None:
    rng = random.Random(first)
    # Text zlib cannot shrink, 2 KB a line (the wire's longest), shared by this sender's reports.
    lines = ["".join(rng.choices(string.ascii_letters + string.digits, k=2048)) for _ in range(JUNK_RANKS + 10)]
    with httpx.Client(base_url=base, timeout=60) as http:
        for index in range(first, first + count):
            statuses.append(http.post(URL, json=_junk(index, lines)).status_code)


def test_a_padded_flood_under_new_names_leaves_the_monitor_near_its_baseline(tmp_path: Path) -> None:
    env = {"HANGWATCH_MAX_SILENT_BYTES": str(SILENT_BUDGET), "HANGWATCH_JOB_ROOM_SILENT_S": "1"}
    with running_monitor(tmp_path, extra_env=env) as monitor:
        proc = psutil.Process(monitor.proc.pid)
        stop = threading.Event()
        live_statuses: list[int] = []
        junk_statuses: list[int] = []
        live = threading.Thread(target=_keep_reporting, args=(monitor.base, stop, live_statuses))
        live.start()
        try:
            time.sleep(1.5)  # the live node's job diagnosed, the first passes run: the monitor at rest
            baseline = proc.memory_info().rss
            senders = [threading.Thread(target=_flood, args=(monitor.base, n * JUNK_REPORTS // 2, JUNK_REPORTS // 2,
                                                             junk_statuses)) for n in range(2)]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            at_end = rss = proc.memory_info().rss
            deadline = time.monotonic() + SETTLE_WAIT_S
            while rss > baseline + SETTLED_ABOVE_BASELINE and time.monotonic() < deadline:
                time.sleep(0.25)
                rss = proc.memory_info().rss
            live_job = httpx.get(f"{monitor.base}/diagnose", params={"job": "job-live", "format": "json"}, timeout=30)
        finally:
            stop.set()
            live.join()
    # The live node's reports may be shed (503) while the loop is behind, never refused.
    assert junk_statuses == [202] * JUNK_REPORTS and set(live_statuses) <= {202, 503}
    assert rss <= baseline + SETTLED_ABOVE_BASELINE, (
        f"RSS {baseline / MIB:.0f} MiB before the flood, {at_end / MIB:.0f} MiB at its end, still {rss / MIB:.0f} "
        f"MiB {SETTLE_WAIT_S:.0f} s after it (bound: baseline + {SETTLED_ABOVE_BASELINE / MIB:.0f} MiB)")
    assert live_job.status_code == 200, "the node that kept reporting lost its job to the junk"
