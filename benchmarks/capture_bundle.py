"""What an evidence capture of one big job costs the monitor (monitor/storage/capture_store.py, issue 19).

    python benchmarks/capture_bundle.py [--ranks 1000] [--ranks-per-node 8] [--uploaders 16] [--repeat 3]

A real monitor (a process of its own, loopback) follows one job of N ranks on N/8 simulated nodes;
rank 0 is stopped, so the job's incident starts at once and the capture (after 1 s) is asked of
every node in the answers to its reports. Each simulated node then uploads its part, as the agent
does: gzipped JSON with, per rank, a 40-frame native stack, a 64 KiB log tail and a Flight Recorder
summary (text that compresses as real logs do), ``--uploaders`` at a time. Prints, per run: the
time from the first order to the last part on disk, the part sizes, the monitor's CPU time and RSS
growth over the uploads, the bundle's size on disk, and the download (a tar) time. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hangwatch.demo.harness import free_port, tool  # noqa: E402

WORDS = ("loss", "step", "lr", "grad_norm", "tokens/s", "epoch", "iter", "mem", "eval", "ckpt", "all_reduce",
         "rank", "nccl", "gloo", "batch", "warmup", "time", "data", "sampler", "shard")


def log_tail(rng: random.Random, size: int = 64 * 1024) -> str:
    lines, total = [], 0
    step = rng.randint(1000, 90000)
    while total < size:
        step += 1
        line = (f"[2026-11-26 06:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}] step {step} "
                + " ".join(f"{rng.choice(WORDS)}={rng.random():.4f}" for _ in range(6)) + "\n")
        lines.append(line)
        total += len(line)
    return "".join(lines)[-size:]


def rank_part(rng: random.Random, rank: int, pid: int) -> dict:
    frames = [{"name": f"fn_{rng.randint(0, 500)}", "file": f"/opt/venv/lib/python3.11/site-packages/torch/mod{i}.py",
               "line": rng.randint(1, 4000), "native": i % 3 == 0} for i in range(40)]
    groups = [{"pg": str(g), "desc": "default_pg", "size": 1000, "last_enqueued": 4000 + rank % 3,
               "last_started": 3999, "last_completed": 3999,
               "recent": [{"seq": 3990 + k, "op": "all_reduce", "state": "completed"} for k in range(10)]}
              for g in range(2)]
    return {"rank": rank, "pid": pid, "alive": True, "errors": {},
            "stack": {"taken_at": time.time(), "native": True, "duration_s": 0.4,
                      "threads": [{"tid": pid, "name": "MainThread", "frames": frames}]},
            "flight_recorder": {"status": "ok", "version": "2.10", "groups": groups},
            "logs": {f"/logs/rank{rank}.log": log_tail(rng)}}


def node_part(node: str, ranks: list[int], bundle: str, job_id: str, seed: int) -> bytes:
    rng = random.Random(seed)
    part = {"bundle": bundle, "job_id": job_id, "node": node, "taken_at": time.time(),
            "ranks": [rank_part(rng, r, 10_000 + r) for r in ranks], "nccl_ras": None}
    return gzip.compress(json.dumps(part).encode(), compresslevel=5)


def report(node: str, ranks: list[int], job_id: str, world: int) -> dict:
    return {"schema_version": 1, "node": node, "sent_at": time.time(),
            "agent": {"version": "bench", "interval_s": 1.0},
            "ranks": [{"job_id": job_id, "rank": r, "world_size": world, "local_rank": r % 8, "pid": 10_000 + r,
                       "cmdline": "python train.py", "alive": True, "state": "T" if r == 0 else "S",
                       "cpu_percent": 0.0} for r in ranks]}


def one_run(n_ranks: int, per_node: int, uploaders: int, workdir: Path) -> dict:
    port = free_port()
    capture_dir = workdir / "captures"
    env = {**os.environ, "HANGWATCH_CAPTURE_AFTER_S": "1", "HANGWATCH_CAPTURE_DIR": str(capture_dir),
           "HANGWATCH_MAX_WORLD_SIZE": str(max(n_ranks, 4096))}
    log = open(workdir / "monitor.log", "w")
    proc = subprocess.Popen([tool("hangwatch-monitor"), "--host", "127.0.0.1", "--port", str(port), "--db",
                             str(workdir / "monitor.db"), "--log-level", "warning"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        job_id = "10.0.0.1:29500"
        nodes = {f"node-{i:04d}": list(range(i * per_node, min(n_ranks, (i + 1) * per_node)))
                 for i in range((n_ranks + per_node - 1) // per_node)}
        orders: dict[str, dict] = {}
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 60
            while len(orders) < len(nodes) and time.monotonic() < deadline:
                for node, ranks in nodes.items():
                    if node in orders:
                        continue
                    answer = client.post(base + "/api/v1/reports", json=report(node, ranks, job_id, n_ranks)).json()
                    for order in answer.get("orders", []):
                        if "capture" in order:
                            orders[node] = order["capture"]
                time.sleep(0.2)
        first_order_at = time.monotonic()
        bundle = next(iter(orders.values()))["bundle"]
        bodies = {node: node_part(node, nodes[node], bundle, job_id, seed=i) for i, node in enumerate(nodes)}
        monitor = psutil.Process(proc.pid)
        rss_before, cpu_before = monitor.memory_info().rss, sum(monitor.cpu_times()[:2])
        started = time.monotonic()

        def upload(node: str) -> int:
            with httpx.Client(timeout=60) as client:
                response = client.post(base + orders[node]["upload"], content=bodies[node],
                                       headers={"content-type": "application/json", "content-encoding": "gzip"})
                return response.status_code

        with ThreadPoolExecutor(max_workers=uploaders) as pool:
            statuses = list(pool.map(upload, nodes))
        took = time.monotonic() - started
        rss_after, cpu_after = monitor.memory_info().rss, sum(monitor.cpu_times()[:2])
        listed = httpx.get(base + "/api/v1/captures", params={"job": job_id}, timeout=10).json()["captures"][0]
        started = time.monotonic()
        tar_bytes = 0
        with httpx.stream("GET", base + listed["download"], timeout=120) as response:
            for chunk in response.iter_bytes():
                tar_bytes += len(chunk)
        download = time.monotonic() - started
        on_disk = sum(p.stat().st_size for p in (capture_dir / bundle).iterdir())
        sizes = sorted(len(b) for b in bodies.values())
        return {"nodes": len(nodes), "ok": statuses.count(201), "upload_s": took,
                "order_to_last_part_s": time.monotonic() - first_order_at - download,
                "part_kib": statistics.median(sizes) / 1024, "bundle_mib": on_disk / 2**20,
                "cpu_s": cpu_after - cpu_before, "rss_growth_mib": (rss_after - rss_before) / 2**20,
                "rss_mib": rss_after / 2**20, "download_s": download, "tar_mib": tar_bytes / 2**20,
                "received": listed["nodes_received"]}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--uploaders", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        workdir = Path(tempfile.mkdtemp(prefix="hangwatch-capture-bench-"))
        try:
            run = one_run(args.ranks, args.ranks_per_node, args.uploaders, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        runs.append(run)
        print(f"run {i + 1}: {run['ok']}/{run['nodes']} parts taken ({run['received']} listed), median part "
              f"{run['part_kib']:.0f} KiB, bundle {run['bundle_mib']:.1f} MiB; uploads {run['upload_s']:.2f} s; "
              f"monitor CPU {run['cpu_s']:.2f} s, RSS +{run['rss_growth_mib']:.1f} MiB (to {run['rss_mib']:.0f} MiB); "
              f"tar {run['tar_mib']:.1f} MiB in {run['download_s']:.2f} s", flush=True)
    keys = ("upload_s", "cpu_s", "rss_growth_mib", "download_s")
    print(f"median of {len(runs)} ({args.ranks} ranks, {args.uploaders} uploaders): "
          + ", ".join(f"{k} {statistics.median(r[k] for r in runs):.2f}" for k in keys))


if __name__ == "__main__":
    main()
