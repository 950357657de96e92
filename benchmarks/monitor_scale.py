"""How many ranks one monitor holds: simulated agents against a real uvicorn monitor.

    python benchmarks/monitor_scale.py --nodes 1250 [--ranks-per-job 64] [--protocol delta]
        [--duration 60] [--warmup 15] [--monitor-cpus 0,1] [--monitors 1] [--load-procs 1] [--json out.json]
        [--fault deadlock|straggler] [--sweep 64,1000,2000,4000,10000]
        [--restart [--down-s 3] [--restart-after 20] [--watch-s 30] [--ignore-full-in] [--journal]]
        [--relays N [--relay-cpus 1] [--summarise]] [--report-interval 1]

Starts a real ``hangwatch-monitor`` (optionally pinned with ``taskset``; with ``--monitors N``,
N of them sharded by job id the way agents given N ``--monitor`` URLs shard, each pinned to
one CPU of ``--monitor-cpus`` in turn), feeds it ``--nodes``
simulated nodes of 8 ranks (one report a second each, or one every ``--report-interval`` seconds,
said in the reports' ``agent.interval_s`` as the agent says its own; built by ``simulated_nodes`` from
the wire schema; ``--protocol full`` replays what pre-delta agents send), probes the read
endpoints the way people and Prometheus do, and injects a fault into one job a third of
the way into the measured window: a deadlock (rank 1 leaves the loop), or with ``--fault
straggler`` rank 1 doing 30% more work per step than the rest (the job steps on, slower;
give it ``--duration 120``: the ranks' CPU levels are half-minute medians). It prints:

- achieved reports/s and the share accepted, shed (503) or failed;
- latency percentiles per endpoint (ingest, ``/diagnose`` in its views, ``/metrics``, the page);
- the monitor's CPU (share of the cores it may use) and peak RSS, and its CPU-milliseconds per
  node report, a figure that stays stable when the load generator shares the machine;
- the database's size and its growth, per hour;
- seconds from the injected fault to the right verdict and culprit, and every other alarm or
  culprit that was published for the job (before the fault: false alarms).

``--restart``: the restart herd. The deadlock is injected 5 s into the measured window; once the
monitor has had ``--restart-after`` seconds to find it, the monitor is killed (SIGKILL) and started
again ``--down-s`` later on the same database and port, and the job's answer is read every
0.25 s for ``--watch-s``. It prints how long until the monitor answers, until the job's verdict is
right again (the deadlock and its culprit judged from the rebuilt picture, not the alarm held
through the restart: "cannot check now"), every verdict shown meanwhile (a ``healthy`` is a
false one), the full reports a second at their peak, and the posts' p99 while it rebuilds.
``--ignore-full-in``: the simulated agents send the full report at once when asked, as agents
before the monitor paced them did. ``--journal``: they keep an outage journal as the agent does,
and deliver it (replayed reports) before their first live report.

``--summarise`` (with ``--relays N``): the relays run ``hangwatch-relay --summarise``, each with a
name of its own, keep the giant job's picture and send the monitor (the owner) a summary of it a
second instead of its reports. It prints, beside the above, the owner's CPU-seconds a second and
its last diagnosis passes, the summaries it took a second, the relays' CPU, RSS, summary sizes and
build times, and the load generator's CPU (is it offering what was asked).

The monitor's and relays' limits (world size, nodes, ranks, connections) are raised past their
defaults where the simulated cluster needs it (``limit_flags``).

It asserts nothing: figures go in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load_client import Behaviour, HttpConnection, LoadStats, run_shard  # noqa: E402
from simulated_nodes import RANKS_PER_NODE, check_against_schema, cluster  # noqa: E402

from agent.shards import owner  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
LAG_SERIES = b"hangwatch_monitor_event_loop_lag_seconds "
# (name, path, seconds between probes)
PROBES = (
    ("diagnose json (all jobs)", "/diagnose?format=json", 2.0),
    ("diagnose json (one job)", "/diagnose?format=json&job={job}", 0.5),
    ("diagnose json (summary)", "/diagnose?format=json&view=summary", 1.0),
    ("diagnose text (problems)", "/diagnose?problems=1", 2.0),
    ("metrics", "/metrics", 5.0),
    ("page", "/", 2.0),
)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


# The monitor's defaults (monitor/ingest/limits.py, monitor/web/http_guard.py): a cluster past them
# is given room rather than refused.
DEFAULT_MAX_WORLD_SIZE = 65536
DEFAULT_MAX_NODES = 10_000
DEFAULT_MAX_RANKS = 100_000
DEFAULT_MAX_CONNECTIONS = 4096


def limit_flags(nodes: int, ranks_per_job: int, connections: int) -> list[str]:
    """The monitor's flags for a cluster of ``nodes`` nodes, in jobs of ``ranks_per_job`` ranks,
    posting on ``connections`` connections; none where its defaults hold it."""
    flags = []
    if ranks_per_job > DEFAULT_MAX_WORLD_SIZE:
        flags += ["--max-world-size", str(2 * ranks_per_job)]
    if nodes > DEFAULT_MAX_NODES:
        flags += ["--max-nodes", str(2 * nodes)]
    if nodes * RANKS_PER_NODE >= DEFAULT_MAX_RANKS:
        flags += ["--max-ranks", str(2 * nodes * RANKS_PER_NODE)]
    if connections > DEFAULT_MAX_CONNECTIONS - 100:  # the probes' connections too
        flags += ["--max-connections", str(connections + 1000)]
    return flags


def start_relay(port: int, monitor_port: int, cpus: str | None, log: Path, extra: list[str]) -> subprocess.Popen:
    exe = str(Path(sys.executable).with_name("hangwatch-relay"))
    cmd = [exe, "--port", str(port), "--monitor", f"http://127.0.0.1:{monitor_port}", "--log-level", "warning",
           *extra]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def start_monitor(port: int, db: Path, cpus: str | None, extra: list[str]) -> subprocess.Popen:
    exe = str(Path(sys.executable).with_name("hangwatch-monitor"))
    cmd = [exe, "--port", str(port), "--db", str(db), "--log-level", "warning", *extra]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(db.with_suffix(".log"), "w"))


async def wait_ready(port: int, deadline: float) -> None:
    while time.time() < deadline:
        try:
            conn = HttpConnection("127.0.0.1", port)
            status, _ = await conn.request("GET", "/healthz")
            conn.close()
            if status == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("monitor did not come up")


async def probe(port: int, name: str, path: str, every: float, until: float, window: tuple[float, float],
                latencies: dict[str, list[float]], sizes: dict[str, int], gauges: dict[bytes, list[float]]) -> None:
    """Read ``path`` every ``every`` seconds until ``until``; its answer times in the window, and from
    ``/metrics`` the monitor's own gauges named in ``gauges``."""
    conn = HttpConnection("127.0.0.1", port)
    while time.time() < until:
        started = time.time()
        try:
            status, body = await asyncio.wait_for(conn.request("GET", path), 30)
            if path == "/" and status == 200:  # the page is its HTML and its script
                status, _ = await asyncio.wait_for(conn.request("GET", "/static/app.js"), 30)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            conn.close()
            status, body = None, b""
        took = time.time() - started
        if window[0] <= started < window[1]:
            latencies.setdefault(name, []).append(took if status == 200 else float("inf"))
            sizes[name] = len(body)
            if path == "/metrics" and status == 200:
                # The monitor's own view of being behind: its event loop's lag over the last second,
                # its last diagnosis pass. Found, not parsed: the body is megabytes, and every probe
                # shares this loop.
                for series, values in gauges.items():
                    at = body.find(b"\n" + series)
                    if at >= 0:
                        values.append(float(body[at + len(series) + 1:body.index(b"\n", at + 1)]))
        await asyncio.sleep(max(0.0, every - took))
    conn.close()


async def watch_fault(port: int, job: str, verdict: str, culprit: int, inject_at: float, until: float,
                      other: list[str]) -> float | None:
    """Seconds from ``inject_at`` to ``verdict`` naming ``culprit`` alone; any other alarm or culprit
    published for the job on the way goes into ``other``."""
    conn = HttpConnection("127.0.0.1", port)
    try:
        while time.time() < until:
            await asyncio.sleep(0.25)
            try:
                status, body = await asyncio.wait_for(conn.request("GET", f"/diagnose?format=json&job={job}"), 30)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                conn.close()
                continue
            jobs = orjson.loads(body).get("jobs", []) if status == 200 else []
            if not jobs:
                continue
            seen, named = jobs[0]["verdict"], jobs[0]["culprit_ranks"]
            if time.time() >= inject_at and seen == verdict and named == [culprit]:
                return time.time() - inject_at
            if seen not in ("healthy", "unknown") or named:
                when = "before" if time.time() < inject_at else "after"
                other.append(f"{when} the fault: {seen} {named[:10]}")
        return None
    finally:
        conn.close()


async def observe(pids: list[int], ports: list[int], dbs: list[Path], window: tuple[float, float], end: float,
                  job: str, fault: str, culprit: int, inject_at: float, relay_pids: list[int] | None = None,
                  relay_ports: list[int] | None = None, load_pids: list[int] | None = None) -> dict:
    latencies: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    lags: list[float] = []
    passes: list[float] = []
    gauges = {LAG_SERIES: lags, PASS_SERIES: passes}
    owner_port = ports[[f"http://127.0.0.1:{p}" for p in ports].index(owner(job, [f"http://127.0.0.1:{p}" for p in ports]))]
    probes = [asyncio.create_task(probe(owner_port if "{job}" in path else port, name, path.format(job=job), every,
                                        end, window, latencies, sizes, gauges))
              for name, path, every in PROBES for port in ports if "{job}" not in path or port == ports[0]]
    other: list[str] = []
    detect = asyncio.create_task(watch_fault(owner_port, job, fault, culprit, inject_at, end, other))
    await asyncio.sleep(max(0.0, window[0] - time.time()))
    cpu0, db0, peak = sum(map(cpu_seconds, pids)), sum(map(db_bytes, dbs)), 0
    relay_cpu0 = sum(map(cpu_seconds, relay_pids or []))
    load_cpu0 = sum(map(cpu_seconds, load_pids or []))
    relay_rss_peak = 0
    lag0 = await lag_buckets(ports)
    answered0 = await lag_buckets(relay_ports or [], RELAY_ANSWER_BUCKET)
    built0 = await lag_buckets(relay_ports or [], SUMMARY_BUILD_BUCKET)
    counters0 = await scrape_counters(ports, relay_ports or [])
    while time.time() < window[1]:
        peak = max(peak, sum(map(rss_bytes, pids)))
        relay_rss_peak = max([relay_rss_peak, *map(rss_bytes, relay_pids or [])])
        await asyncio.sleep(1.0)
    cpu1, db1 = sum(map(cpu_seconds, pids)), sum(map(db_bytes, dbs))
    relay_cpu_s = sum(map(cpu_seconds, relay_pids or [])) - relay_cpu0
    load_cpu_s = sum(map(cpu_seconds, load_pids or [])) - load_cpu0
    lag1 = await lag_buckets(ports)
    answered1 = await lag_buckets(relay_ports or [], RELAY_ANSWER_BUCKET)
    built1 = await lag_buckets(relay_ports or [], SUMMARY_BUILD_BUCKET)
    counters1 = await scrape_counters(ports, relay_ports or [])
    relay_answers = {bound: answered1.get(bound, 0) - answered0.get(bound, 0) for bound in answered1}
    summary_builds = {bound: built1.get(bound, 0) - built0.get(bound, 0) for bound in built1}
    probe_lags = {bound: lag1.get(bound, 0) - lag0.get(bound, 0) for bound in lag1}
    detected = await detect
    await asyncio.gather(*probes)
    # When the monitor judged it (its history's time: the pass that published it), beside when the
    # watcher read it: the difference is the answer's rendering and the watcher's polling.
    conn = HttpConnection("127.0.0.1", owner_port)
    status, body = await conn.request("GET", f"/api/v1/jobs/{job}/history")
    conn.close()
    changes = orjson.loads(body)["history"] if status == 200 else []
    judged = next((c["at"] - inject_at for c in changes if c["at"] >= inject_at and c["verdict"] == fault
                   and c["culprit_ranks"] == [culprit]), None)
    own = []
    for port in ports:
        conn = HttpConnection("127.0.0.1", port)
        _, metrics = await conn.request("GET", "/metrics")
        conn.close()
        own += [f"{port}: {line}" for line in metrics.decode().splitlines() if line.startswith("hangwatch_monitor_")]
    return {"cpu_s": cpu1 - cpu0, "db_start": db0, "db_end": db1, "rss_peak": peak, "latencies": latencies,
            "sizes": sizes, "detected_s": detected, "judged_s": judged, "other_answers": other, "monitor_metrics": own, "lags": lags,
            "probe_lags": probe_lags, "relay_cpu_s": relay_cpu_s, "load_cpu_s": load_cpu_s,
            "relay_rss_peak": relay_rss_peak, "passes": passes,
            "counters": {name: counters1[name] - counters0[name] for name, _, _ in COUNTERS},
            "summary_bytes": counters1.get("summary_bytes_each", []),
            "summary_build_p50_ms": (histogram_quantile(0.5, summary_builds) or 0) * 1000 if summary_builds else None,
            "summary_build_p99_ms": (histogram_quantile(0.99, summary_builds) or 0) * 1000 if summary_builds else None,
            "relay_answer_p50_ms": (histogram_quantile(0.5, relay_answers) or 0) * 1000 if relay_answers else None,
            "relay_answer_p99_ms": (histogram_quantile(0.99, relay_answers) or 0) * 1000 if relay_answers else None}


LAG_BUCKET = "hangwatch_monitor_event_loop_probe_lag_seconds_bucket{le=\""
RELAY_ANSWER_BUCKET = "hangwatch_relay_answer_seconds_bucket{le=\""
SUMMARY_BUILD_BUCKET = "hangwatch_relay_summary_build_seconds_bucket{le=\""
PASS_SERIES = b"hangwatch_monitor_diagnosis_pass_seconds "
# Counters read at the window's edges: (name in the figures, whose /metrics, the series' line start).
COUNTERS = (
    ("summaries_taken", "monitors", "hangwatch_monitor_summaries_total "),
    ("summaries_sent", "relays", 'hangwatch_relay_summaries_total{outcome="sent"} '),
    ("summaries_refused", "relays", 'hangwatch_relay_summaries_total{outcome="refused"} '),
    ("summaries_failed", "relays", 'hangwatch_relay_summaries_total{outcome="failed"} '),
    ("relay_reports_refused", "relays", 'hangwatch_relay_reports_total{outcome="refused"'),
)
SUMMARY_BYTES = "hangwatch_relay_summary_bytes "


async def metrics_lines(port: int) -> list[str]:
    """The lines of ``/metrics`` on ``port``."""
    conn = HttpConnection("127.0.0.1", port)
    try:
        _, body = await asyncio.wait_for(conn.request("GET", "/metrics"), 30)
    finally:
        conn.close()
    return body.decode().splitlines()


async def scrape_counters(ports: list[int], relay_ports: list[int]) -> dict:
    """``COUNTERS`` summed over the monitors and the relays, and each relay's last summary's size
    (``summary_bytes_each``)."""
    out: dict = {name: 0.0 for name, _, _ in COUNTERS}
    out["summary_bytes_each"] = []
    for kind, port in [("monitors", p) for p in ports] + [("relays", p) for p in relay_ports]:
        for line in await metrics_lines(port):
            for name, whose, start in COUNTERS:
                if whose == kind and line.startswith(start):
                    out[name] += float(line.rsplit(" ", 1)[1])
            if kind == "relays" and line.startswith(SUMMARY_BYTES):
                out["summary_bytes_each"].append(int(float(line.rsplit(" ", 1)[1])))
    return out


async def lag_buckets(ports: list[int], bucket: str = LAG_BUCKET) -> dict[float, int]:
    """The monitors' loop-lag histograms (cumulative probe counts by upper bound), summed; or, with
    ``bucket``, another histogram of theirs (the relays' answer times)."""
    counts: dict[float, int] = {}
    for port in ports:
        for line in await metrics_lines(port):
            if line.startswith(bucket):
                bound, value = line[len(bucket):].split('"} ')
                counts[float(bound)] = counts.get(float(bound), 0) + int(float(value))
    return counts


def histogram_quantile(q: float, cumulative: dict[float, int]) -> float | None:
    """As Prometheus's histogram_quantile: linear within the bucket the quantile falls in."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0
    for bound in bounds:
        if cumulative[bound] >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative[bound] - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative[bound]
    return lower


# What a restarted monitor adds to an alarm it holds until it can judge the job again (monitor.diagnosis.stability).
HELD_UNCHECKED = "cannot check now"


async def observe_restart(monitors: list[subprocess.Popen], restart: Callable[[], subprocess.Popen], port: int,
                          job: str, fault: str, culprit: int, restart_at: float, down_s: float, end: float,
                          py_spy: str | None = None) -> dict:
    """Kill the monitor at ``restart_at``, start it again ``down_s`` later, and read the job's answer until
    ``end``: when it answers again, when its verdict is right again, and what it showed meanwhile."""
    await asyncio.sleep(max(0.0, restart_at - time.time()))
    before = await job_answer(port, job)
    monitors[0].kill()
    monitors[0].wait(timeout=30)
    killed_at = time.time()
    await asyncio.sleep(down_s)
    monitors[0] = restart()
    started_at = time.time()
    profiler = None
    if py_spy:  # the restarted monitor, from its start to the end of the watch
        profiler = subprocess.Popen(["py-spy", "record", "--nonblocking", "--threads", "--rate", "100", "--format", "raw",
                                     "--duration", str(int(end - started_at)), "--pid", str(monitors[0].pid),
                                     "--output", py_spy], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    seen: list[tuple[float, str, list[int], str]] = []
    right_at = answering_at = None
    peak_rss, cpu0 = 0, None
    while time.time() < end:
        answer = await job_answer(port, job)
        at = time.time() - started_at
        if answer is not None:
            answering_at = at if answering_at is None else answering_at
            cpu0 = cpu_seconds(monitors[0].pid) if cpu0 is None else cpu0
            verdict, named, summary = answer["verdict"], answer["culprit_ranks"], answer["summary"]
            seen.append((at, verdict, named, summary))
            if right_at is None and verdict == fault and named == [culprit] and HELD_UNCHECKED not in summary:
                right_at = at
        if monitors[0].poll() is None:
            peak_rss = max(peak_rss, rss_bytes(monitors[0].pid))
        await asyncio.sleep(0.25)
    cpu_s = cpu_seconds(monitors[0].pid) - cpu0 if cpu0 is not None and monitors[0].poll() is None else None
    if profiler is not None:
        profiler.wait(timeout=60)
    conn = HttpConnection("127.0.0.1", port)
    _, metrics = await conn.request("GET", "/metrics")
    conn.close()
    own = [line for line in metrics.decode().splitlines() if line.startswith("hangwatch_monitor_")]
    return {"before": None if before is None else (before["verdict"], before["culprit_ranks"]),
            "killed_at": killed_at, "started_at": started_at, "answering_s": answering_at, "right_s": right_at,
            "seen": seen, "rss_peak": peak_rss, "cpu_s": cpu_s, "monitor_metrics": own}


async def job_answer(port: int, job: str) -> dict | None:
    conn = HttpConnection("127.0.0.1", port)
    try:
        status, body = await asyncio.wait_for(conn.request("GET", f"/diagnose?format=json&job={job}"), 10)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        return None
    finally:
        conn.close()
    jobs = orjson.loads(body).get("jobs", []) if status == 200 else []
    return jobs[0] if jobs else None


def summarise_restart(args: argparse.Namespace, stats: LoadStats, observed: dict) -> dict:
    started = observed["started_at"]
    right = observed["right_s"]
    rebuild_end = started + (right if right is not None else args.watch_s)
    per_second: dict[int, int] = {}
    for at in stats.full_at:
        if at >= started:
            per_second[int(at - started)] = per_second.get(int(at - started), 0) + 1
    during = [took for took, at in zip(stats.latencies, stats.latency_at) if started <= at < rebuild_end]
    # Posts that got no answer once the monitor was up again (a refused connection before it listens
    # is the outage's): timeouts and resets while it rebuilds.
    answering_at = started + (observed["answering_s"] or 0.0)
    failed_after = sum(1 for at in stats.failed_at if answering_at <= at < rebuild_end)
    steady = [took for took, at in zip(stats.latencies, stats.latency_at) if at < observed["killed_at"]]
    # Per second after the restart: posts taken, failed (no answer), full reports sent.
    timeline = [[0, 0, 0] for _ in range(int(args.down_s + args.watch_s))]
    for series, times in ((0, stats.latency_at), (1, stats.failed_at), (2, stats.full_at)):
        for at in times:
            second = int(at - started)
            if 0 <= second < len(timeline):
                timeline[second][series] += 1
    healthy = [s for s in observed["seen"] if s[1] == "healthy"]
    runs: list[tuple[float, str, str]] = []  # each change of what was shown: (at, verdict, summary)
    for at, verdict, named, summary in observed["seen"]:
        shown = f"{verdict} {named[:4]}" + (" (held, unchecked)" if HELD_UNCHECKED in summary else "")
        # A change of what is said counts too (its figures aside): "refreshing" has several reasons.
        said = re.sub(r"[\d.]+", "#", summary[:70])
        if not runs or runs[-1][1] != shown or re.sub(r"[\d.]+", "#", runs[-1][2][:70]) != said:
            runs.append((at, shown, summary))
    figures = {
        "ranks": args.nodes * RANKS_PER_NODE, "nodes": args.nodes, "ranks_per_job": args.ranks_per_job,
        "ignore_full_in": args.ignore_full_in, "journal": args.journal, "relays": args.relays,
        "down_s": args.down_s, "verdict_before": observed["before"],
        "answering_s": observed["answering_s"], "right_s": right, "healthy_shown": len(healthy),
        "full_reports_after_restart": sum(per_second.values()),
        "full_per_s_peak": max(per_second.values(), default=0),
        "full_per_s": [per_second.get(i, 0) for i in range(int(args.watch_s))],
        "replayed": stats.replayed, "post_p50_ms_rebuilding": (percentile(during, 0.5) or 0) * 1000,
        "post_p99_ms_rebuilding": (percentile(during, 0.99) or 0) * 1000, "posts_rebuilding": len(during),
        "failed": stats.failed, "failed_rebuilding": failed_after, "shed": stats.shed,
        "post_p99_ms_before": (percentile(steady, 0.99) or 0) * 1000, "timeline": timeline,
        "monitor_cpu_s_after_restart": observed["cpu_s"], "rss_peak_mib": observed["rss_peak"] / 2**20,
        "shown": [(round(at, 2), shown) for at, shown, _ in runs], "monitor_metrics": observed["monitor_metrics"],
    }
    print(f"restart under a job of {args.ranks_per_job} ranks ({args.nodes} nodes), down {args.down_s:.0f} s, "
          f"agents {'ignore' if args.ignore_full_in else 'take'} the monitor's pacing"
          + (", keep an outage journal" if args.journal else "") + (f", {args.relays} relays" if args.relays else ""))
    print(f"before the restart the job showed {observed['before']}")
    print(f"answering {observed['answering_s'] if observed['answering_s'] is not None else float('nan'):.1f} s after "
          f"the restart; right again ({args.fault} {[1]}, judged) "
          + (f"{right:.1f} s after the restart" if right is not None else f"NOT within {args.watch_s:.0f} s"))
    print(f"healthy shown meanwhile: {len(healthy)} answers" + "".join(f"\n  {h[0]:.1f}s {h[3][:160]}" for h in healthy[:3]))
    print("what the job showed:" + "".join(f"\n  {at:6.2f}s {shown}: {summary[:140]}" for at, shown, summary in runs[:16]))
    if observed["seen"]:  # the same verdict can hide a changing summary (how many nodes it still waits for)
        at, _, _, summary = observed["seen"][-1]
        print(f"  last answer, at {at:.2f}s: {summary[:300]}")
    print(f"full reports after the restart: {figures['full_reports_after_restart']}, peak {figures['full_per_s_peak']}/s; "
          f"per second: {figures['full_per_s'][:16]}; kept reports replayed: {stats.replayed}")
    print(f"posts while rebuilding: {len(during)} taken, p50 {ms(percentile(during, 0.5))}, "
          f"p99 {ms(percentile(during, 0.99))}; {failed_after} failed once it answered ({stats.failed} in all, "
          f"the outage's included), shed {stats.shed}")
    print(f"posts before the restart: p99 {ms(percentile(steady, 0.99))}; after it, a second each "
          "(taken/failed/full): " + " ".join(f"{t}/{f}/{u}" for t, f, u in timeline[:int(args.watch_s)]))
    cpu_s = observed["cpu_s"]
    print(f"restarted monitor: CPU {cpu_s if cpu_s is not None else float('nan'):.1f} s from its first answer to the "
          f"end, peak RSS {figures['rss_peak_mib']:.0f} MiB")
    for line in observed["monitor_metrics"]:
        if line.startswith(("hangwatch_monitor_full_reports", "hangwatch_monitor_reports_replay",
                            "hangwatch_monitor_deltas_deferred")):
            print("  " + line)
    return figures


def shard_main(conn, nodes, ports, protocol, start, window, end, behaviour) -> None:  # type: ignore[no-untyped-def]
    stats = run_shard(nodes, ports, protocol, start, window, end, behaviour)
    conn.send(stats)
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=125, help="simulated nodes of 8 ranks (default 125)")
    parser.add_argument("--ranks-per-job", type=int, default=64)
    parser.add_argument("--protocol", choices=("delta", "full"), default="delta")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--monitor-cpus", help="taskset CPU list for the monitor, e.g. 0,1")
    parser.add_argument("--monitors", type=int, default=1, help="monitors sharded by job id (default 1)")
    parser.add_argument("--load-cpus", help="taskset CPU list for the load generator, e.g. 2-15")
    parser.add_argument("--relays", type=int, default=0, help="relays (hangwatch-relay) in front of the one monitor, "
                        "each taking an equal share of the nodes (default 0: nodes post to the monitor)")
    parser.add_argument("--relay-cpus", help="taskset CPU list for the relays, e.g. 2-5")
    parser.add_argument("--summarise", action="store_true", help="the relays summarise giant jobs for the monitor "
                        "(hangwatch-relay --summarise, each --name relay-I) instead of forwarding their reports")
    parser.add_argument("--report-interval", type=float, default=1.0, metavar="S",
                        help="seconds between a simulated node's reports, said in its reports (default 1)")
    parser.add_argument("--load-procs", type=int, default=1, help="load generator processes")
    parser.add_argument("--port", type=int, default=18787)
    parser.add_argument("--monitor-arg", action="append", default=[], help="extra hangwatch-monitor argument")
    parser.add_argument("--relay-arg", action="append", default=[], help="extra hangwatch-relay argument "
                        "(e.g. --relay-arg=--summary-interval=2)")
    parser.add_argument("--fault", choices=("deadlock", "straggler"), default="deadlock",
                        help="what goes wrong in the first job a third of the way in")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--py-spy", metavar="FILE", help="record the (first) monitor with py-spy over the measured "
                        "window (collapsed stacks, all threads, without pausing it) and print its hottest frames")
    parser.add_argument("--sweep", help="job sizes to run one after the other (e.g. 64,1000,2000,4000,10000), "
                        "each with all --nodes; a table of the cost per report by job size follows")
    parser.add_argument("--restart", action="store_true", help="the restart herd: kill the monitor under the "
                        "deadlocked job and start it again on the same database (see above)")
    parser.add_argument("--restart-after", type=float, default=20.0, help="seconds after the fault (default 20)")
    parser.add_argument("--down-s", type=float, default=3.0, help="seconds the monitor is down (default 3)")
    parser.add_argument("--watch-s", type=float, default=30.0, help="seconds watched after the restart (default 30)")
    parser.add_argument("--ignore-full-in", action="store_true", help="agents send the full report at once when "
                        "asked (as before the monitor paced them)")
    parser.add_argument("--journal", action="store_true", help="agents keep an outage journal and deliver it")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    if not args.sweep:
        figures = run(args)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
        return 0
    rows = []
    for size in (int(s) for s in args.sweep.split(",")):
        print(f"\n=== jobs of {size} ranks", flush=True)
        rows.append(run(argparse.Namespace(**{**vars(args), "ranks_per_job": size})))
    print("\nranks per job  accepted/s (offered)  CPU-ms per report  loop lag p50  p99  /diagnose?job= p99  "
          "/metrics p99  fault found")
    for f in rows:
        one_job = f["endpoints"].get("diagnose json (one job)", {})
        metrics = f["endpoints"].get("metrics", {})
        found = f"{f['fault_detected_s']:.1f} s" if f["fault_detected_s"] is not None else "never"
        print(f"{f['ranks_per_job']:13,d}  {f['reports_per_s']:8.0f} ({f['offered_per_s']:.0f})  "
              f"{f['cpu_ms_per_report'] or float('nan'):17.2f}  {f['probe_lag_p50_ms']:9.0f} ms  "
              f"{f['probe_lag_p99_ms']:4.0f} ms  "
              f"{one_job.get('p99_ms', float('nan')):15.0f} ms  {metrics.get('p99_ms', float('nan')):9.0f} ms  {found}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def run(args: argparse.Namespace) -> dict:
    """One run of the benchmark: its figures, printed and returned."""
    nodes = cluster(args.nodes, args.ranks_per_job)
    check_against_schema(nodes[-1], time.time())
    nodes = cluster(args.nodes, args.ranks_per_job)
    tmp = Path(tempfile.mkdtemp(prefix="hangwatch-scale-"))
    ports = [args.port + i for i in range(args.monitors)]
    dbs = [tmp / f"monitor-{i}.db" for i in range(args.monitors)]
    cpus = args.monitor_cpus.split(",") if args.monitor_cpus and args.monitors > 1 else [args.monitor_cpus]
    relays = getattr(args, "relays", 0)
    summarising = getattr(args, "summarise", False)
    if summarising and not relays:
        raise SystemExit("--summarise is the relays' way: give --relays N")
    # The monitor's connections: the nodes' own without relays, the relays' few with them.
    monitor_args = limit_flags(args.nodes, args.ranks_per_job, 0 if relays else args.nodes) + args.monitor_arg
    monitors = [start_monitor(port, db, cpus[i % len(cpus)], monitor_args)
                for i, (port, db) in enumerate(zip(ports, dbs))]
    if relays and args.monitors > 1:
        raise SystemExit("--relays forwards to one monitor: leave --monitors at 1")
    relay_ports = [args.port + 100 + i for i in range(relays)]
    relay_connections = limit_flags(0, 0, -(-args.nodes // relays)) if relays else []
    monitors += [start_relay(port, ports[0], args.relay_cpus, tmp / f"relay-{i}.log",
                             relay_connections + (["--summarise", "--name", f"relay-{i}"] if summarising else [])
                             + getattr(args, "relay_arg", []))
                 for i, port in enumerate(relay_ports)]
    restarting = getattr(args, "restart", False)
    if restarting and args.monitors > 1:
        raise SystemExit("--restart restarts the one monitor: leave --monitors at 1")
    try:
        for port in ports + relay_ports:
            asyncio.run(wait_ready(port, time.time() + 30))
        start = time.time() + 1.0
        window = (start + args.warmup, start + args.warmup + args.duration)
        inject_at = window[0] + args.duration / 3
        if restarting:
            inject_at = window[0] + 5.0
            restart_at = inject_at + args.restart_after
            window = (window[0], restart_at + args.down_s + args.watch_s)
        end = window[1] + 2.0
        victim = nodes[0].job_id
        culprit = 1
        for n in nodes:
            if n.job_id != victim:
                continue
            if args.fault == "deadlock":
                n.deadlocked_at, n.culprit_rank = inject_at, culprit
            else:  # every node of the job steps at the straggler's pace
                n.straggling_from, n.straggler_rank = inject_at, culprit
        ctx = multiprocessing.get_context("fork")
        pipes, procs = [], []
        for i in range(args.load_procs):
            parent, child = ctx.Pipe()
            # With relays, node k posts to relay k mod N (node-sharded ingest); else to the monitors.
            targets = (lambda node, k=len(relay_ports): [relay_ports[node.index % k]]) if relay_ports else ports
            behaviour = Behaviour(getattr(args, "ignore_full_in", False), getattr(args, "journal", False),
                                  getattr(args, "report_interval", 1.0))
            proc = ctx.Process(target=shard_main, args=(child, nodes[i::args.load_procs], targets, args.protocol,
                                                        start, window, end, behaviour))
            proc.start()
            if args.load_cpus:
                subprocess.run(["taskset", "-pc", args.load_cpus, str(proc.pid)], stdout=subprocess.DEVNULL, check=False)
            pipes.append(parent)
            procs.append(proc)
        profiler = None
        if args.py_spy and not restarting:
            profiler = subprocess.Popen(
                ["sh", "-c", f"sleep {max(0.0, window[0] - time.time()):.2f}; exec py-spy record --nonblocking "
                 f"--threads --rate 100 --format raw --duration {int(args.duration)} --pid {monitors[0].pid} "
                 f"--output {args.py_spy}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        if restarting:
            def again() -> subprocess.Popen:
                return start_monitor(ports[0], dbs[0], cpus[0], monitor_args)
            observed = asyncio.run(observe_restart(monitors, again, ports[0], victim, args.fault, culprit, restart_at,
                                                   args.down_s, window[1], args.py_spy))
        else:
            observed = asyncio.run(observe([m.pid for m in monitors[:len(ports)]], ports, dbs, window, end, victim,
                                           args.fault, culprit, inject_at, [m.pid for m in monitors[len(ports):]],
                                           relay_ports, [proc.pid for proc in procs]))
        stats = LoadStats()
        for parent, proc in zip(pipes, procs):
            stats.merge(parent.recv())
            proc.join()
        if profiler is not None:
            profiler.wait(timeout=60)
    finally:
        for monitor in monitors:
            monitor.terminate()
        for monitor in monitors:
            monitor.wait(timeout=30)
    figures = summarise_restart(args, stats, observed) if restarting else summarise(args, stats, observed)
    if args.py_spy and Path(args.py_spy).exists():
        print_profile(Path(args.py_spy), 100 * int(args.watch_s if restarting else args.duration))
    for db in dbs:
        log_lines = db.with_suffix(".log").read_text(errors="replace").splitlines()
        if log_lines:
            print(f"{db.stem} log: {len(log_lines)} lines, the last ones:", *log_lines[-5:], sep="\n  ")
    shutil.rmtree(tmp, ignore_errors=True)
    return figures


def print_profile(path: Path, possible: int, top: int = 25) -> None:
    """The hottest frames of a py-spy collapsed-stack file (idle samples left out), by own samples and by
    samples inside them, as shares of one core (``possible``: samples one always-busy thread would give)."""
    own: dict[str, int] = {}
    inside: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        threads[frames[0]] = threads.get(frames[0], 0) + count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames[1:]):
            inside[frame] = inside.get(frame, 0) + count
    print(f"py-spy: {total} busy samples of the monitor's threads, {total / max(1, possible) * 100:.0f}% of one core "
          "(shares below are of one core)")
    for title, table in (("threads", threads), ("own samples", own), ("samples inside", inside)):
        print(f"  {title}:")
        for frame, count in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {count / max(1, possible) * 100:5.1f}%  {frame[:150]}")


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return "timeout" if value == float("inf") else f"{value * 1000:.0f} ms"


def summarise(args: argparse.Namespace, stats: LoadStats, observed: dict) -> dict:
    duration = args.duration
    cores = len(args.monitor_cpus.split(",")) if args.monitor_cpus and "-" not in args.monitor_cpus else os.cpu_count()
    cpu_share = observed["cpu_s"] / duration / (cores or 1)
    per_report_ms = observed["cpu_s"] * 1000 / stats.accepted if stats.accepted else None
    growth_h = (observed["db_end"] - observed["db_start"]) / duration * 3600
    figures = {
        "ranks": args.nodes * RANKS_PER_NODE, "nodes": args.nodes, "ranks_per_job": args.ranks_per_job,
        "protocol": args.protocol, "monitors": args.monitors,
        "reports_per_s": stats.accepted / duration, "offered_per_s": stats.sent / duration,
        "shed": stats.shed, "failed": stats.failed, "failed_why": stats.failed_why, "mean_report_bytes": stats.bytes_sent / max(1, stats.sent),
        "full_reports": stats.full_reports,
        "ingest_p50_ms": (percentile(stats.latencies, 0.5) or 0) * 1000,
        "ingest_p99_ms": (percentile(stats.latencies, 0.99) or 0) * 1000,
        "endpoints": {name: {"p50_ms": (percentile(v, 0.5) or 0) * 1000, "p99_ms": (percentile(v, 0.99) or 0) * 1000,
                             "count": len(v), "bytes": observed["sizes"].get(name)}
                      for name, v in observed["latencies"].items()},
        "monitor_cpu_share": cpu_share, "monitor_cores": cores, "cpu_ms_per_report": per_report_ms,
        "relay_cpu_ms_per_report": observed["relay_cpu_s"] * 1000 / stats.accepted if stats.accepted else None,
        "relay_answer_p50_ms": observed["relay_answer_p50_ms"], "relay_answer_p99_ms": observed["relay_answer_p99_ms"],
        "loop_lag_p50_ms": (percentile(observed["lags"], 0.5) or 0) * 1000,
        "loop_lag_max_ms": max(observed["lags"], default=0) * 1000,
        # Every 50 ms probe of the window, from the monitors' histogram (bucket-interpolated).
        "probe_lag_p50_ms": (histogram_quantile(0.5, observed["probe_lags"]) or 0) * 1000,
        "probe_lag_p99_ms": (histogram_quantile(0.99, observed["probe_lags"]) or 0) * 1000,
        "probe_lag_over_100ms": (observed["probe_lags"].get(float("inf"), 0) - observed["probe_lags"].get(0.1, 0)),
        "probes": observed["probe_lags"].get(float("inf"), 0),
        "rss_peak_mib": observed["rss_peak"] / 2**20, "db_mib": observed["db_end"] / 2**20,
        "db_growth_mib_per_h": growth_h / 2**20, "fault": args.fault,
        "fault_detected_s": observed["detected_s"], "fault_judged_s": observed["judged_s"],
        "other_answers": observed["other_answers"],
        "monitor_metrics": observed["monitor_metrics"],
        "report_interval_s": getattr(args, "report_interval", 1.0), "relays": getattr(args, "relays", 0),
        "summarise": getattr(args, "summarise", False),
        "expected_per_s": args.nodes / getattr(args, "report_interval", 1.0),
        "owner_cpu_s_per_s": observed["cpu_s"] / duration, "load_cpu_s_per_s": observed["load_cpu_s"] / duration,
        "relay_cpu_s_per_s": observed["relay_cpu_s"] / duration, "relay_rss_peak_mib": observed["relay_rss_peak"] / 2**20,
        "pass_s_p50": percentile(observed["passes"], 0.5), "pass_s_max": max(observed["passes"], default=None),
        "pass_s_last": observed["passes"][-1] if observed["passes"] else None,
        "summaries_taken_per_s": observed["counters"]["summaries_taken"] / duration,
        "relay_summaries": {k: observed["counters"][k] for k in ("summaries_sent", "summaries_refused",
                                                                 "summaries_failed", "relay_reports_refused")},
        "summary_bytes": observed["summary_bytes"],
        "summary_build_p50_ms": observed["summary_build_p50_ms"],
        "summary_build_p99_ms": observed["summary_build_p99_ms"],
    }
    print(f"ranks {figures['ranks']} ({args.nodes} nodes x {RANKS_PER_NODE}, jobs of {args.ranks_per_job}), "
          f"protocol {args.protocol}, {args.monitors} monitor(s), {duration:.0f} s measured")
    print(f"reports/s accepted {figures['reports_per_s']:.0f} of {figures['offered_per_s']:.0f} offered "
          f"({figures['expected_per_s']:.0f} asked: a report every {figures['report_interval_s']:g} s a node; "
          f"the load generator {figures['load_cpu_s_per_s']:.2f} CPU-s a second) "
          f"(shed {stats.shed}, failed {stats.failed} {stats.failed_why or ''}); mean report {figures['mean_report_bytes'] / 1024:.1f} KiB, "
          f"{stats.full_reports} full")
    print(f"ingest p50 {ms(percentile(stats.latencies, 0.5))} p99 {ms(percentile(stats.latencies, 0.99))} "
          "(seen by the load generator, its own scheduling delay included)")
    lags = observed["lags"]
    print(f"monitor event-loop lag (its own metric, per scrape): p50 {ms(percentile(lags, 0.5))}, "
          f"max {ms(max(lags) if lags else None)}")
    print(f"event-loop lag of every 50 ms probe (its histogram over the window): p50 "
          f"{figures['probe_lag_p50_ms']:.0f} ms, p99 {figures['probe_lag_p99_ms']:.0f} ms, "
          f"{figures['probe_lag_over_100ms']} of {figures['probes']} probes over 100 ms")
    for name, values in observed["latencies"].items():
        size = observed["sizes"].get(name)
        print(f"{name:28s} p50 {ms(percentile(values, 0.5)):>9s} p99 {ms(percentile(values, 0.99)):>9s} "
              f"({len(values)} probes, {size / 1024 if size else 0:.0f} KiB)")
    print(f"monitor CPU {cpu_share * 100:.0f}% of {cores} cores (all monitors); "
          f"{per_report_ms if per_report_ms is not None else float('nan'):.2f} CPU-ms per node report; "
          f"peak RSS {figures['rss_peak_mib']:.0f} MiB")
    if getattr(args, "relays", 0):
        print(f"relays ({args.relays}): {figures['relay_cpu_ms_per_report'] or float('nan'):.2f} CPU-ms per node "
              f"report, all relays together; a report's answer at the relay (its histogram over the window) "
              f"p50 {ms((figures['relay_answer_p50_ms'] or 0) / 1000)}, p99 {ms((figures['relay_answer_p99_ms'] or 0) / 1000)}")
    if figures["summarise"]:
        built = (figures["summary_build_p50_ms"], figures["summary_build_p99_ms"])
        print(f"owner: {figures['owner_cpu_s_per_s']:.2f} CPU-s a second, peak RSS {figures['rss_peak_mib']:.0f} MiB, "
              f"{figures['summaries_taken_per_s']:.1f} summaries taken a second")
        print(f"summarising relays ({args.relays}): {figures['relay_cpu_s_per_s']:.2f} CPU-s a second together, "
              f"peak RSS {figures['relay_rss_peak_mib']:.0f} MiB (the largest); last summary's bytes "
              f"{figures['summary_bytes']}; building one p50 {ms((built[0] or 0) / 1000)}, p99 "
              f"{ms((built[1] or 0) / 1000)}; {figures['relay_summaries']}")
    passes = observed["passes"]
    print(f"owner's diagnosis pass (its last, read at each /metrics probe): p50 {ms(percentile(passes, 0.5))}, "
          f"max {ms(max(passes) if passes else None)}, last {ms(passes[-1] if passes else None)}")
    print(f"database {figures['db_mib']:.1f} MiB, growth {figures['db_growth_mib_per_h']:.0f} MiB/h")
    detected = observed["detected_s"]
    judged = observed["judged_s"]
    print(f"injected {args.fault}: {'found in %.1f s' % detected if detected is not None else 'NOT found'}"
          + (f" (judged {judged:.1f} s after it began, by the monitor's history)" if judged is not None else ""))
    other = observed["other_answers"]
    print(f"other answers for the job: {len(other)}" + "".join(f"\n  {w}" for w in sorted(set(other))[:10]))
    for line in observed["monitor_metrics"]:
        if not line.startswith("#"):
            print("  " + line)
    return figures


if __name__ == "__main__":
    sys.exit(main())
