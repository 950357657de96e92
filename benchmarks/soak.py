"""Soak: does the monitor's or the agent's memory grow over a long run?

One real monitor takes the reports of simulated nodes (benchmarks/simulated_nodes.py, delta
protocol, like the scale benchmark) and of one real agent watching one real, healthy 2-rank
torchrun/gloo job on this machine. The resident memory of the monitor and of the agent is sampled
every ``--every`` seconds; the script prints the series and, for each, the first sample after
the warm-up, the last, the peak and the growth per hour (least squares over the samples after
the warm-up).

    python benchmarks/soak.py --duration 3600 --nodes 125

Beside tests or other agents on the same machine, run it in a PID namespace of its own
(``unshare --pid --fork --mount-proc python benchmarks/soak.py ...``): agents started with
``--own-pid-namespace`` (the tests' ones) then leave its job alone.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio  # noqa: E402

from monitor_scale import rss_bytes, shard_main, start_monitor, wait_ready  # noqa: E402
from simulated_nodes import cluster  # noqa: E402

from hangwatch.demo.harness import Reaper, launch_torchrun, start_agent  # noqa: E402


def slope_per_hour(samples: list[tuple[float, int]]) -> float:
    """Least-squares growth of the samples, in bytes per hour."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in samples) / var * 3600


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds (default 3600)")
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--nodes", type=int, default=125, help="simulated nodes of 8 ranks (default 125)")
    parser.add_argument("--port", type=int, default=18797)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="hangwatch-soak-"))
    db = tmp / "monitor.db"
    monitor = start_monitor(args.port, db, None, [])
    reaper = Reaper()
    series: dict[str, list[tuple[float, int]]] = {"monitor": [], "agent": []}
    try:
        asyncio.run(wait_ready(args.port, time.time() + 30))
        url = f"http://127.0.0.1:{args.port}"
        job = launch_torchrun(reaper, tmp, ["--steps", "100000000", "--step-sleep", "0.2"])
        # --job: only this job, so the soak can run beside tests and other agents on this machine.
        agent = start_agent(reaper, tmp, url, interval=1.0, extra=["--job", job.job_id])
        start = time.time() + 1.0
        end = start + args.warmup + args.duration
        nodes = cluster(args.nodes, 64)
        parent, child = multiprocessing.get_context("fork").Pipe()
        load = multiprocessing.get_context("fork").Process(
            target=shard_main, args=(child, nodes, [args.port], "delta", start, (start + args.warmup, end), end))
        load.start()
        while time.time() < end:
            now = time.time() - start
            series["monitor"].append((now, rss_bytes(monitor.pid)))
            series["agent"].append((now, rss_bytes(agent.proc.pid)))
            print(f"{now:7.0f}s  monitor {series['monitor'][-1][1] / 2**20:6.1f} MiB  "
                  f"agent {series['agent'][-1][1] / 2**20:6.1f} MiB", flush=True)
            time.sleep(args.every)
        parent.recv()
        load.join()
    finally:
        reaper.close()
        monitor.terminate()
        monitor.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{args.nodes * 8} simulated ranks + 1 real 2-rank job, {args.duration:.0f}s after {args.warmup:.0f}s warm-up")
    for name, samples in series.items():
        settled = [s for s in samples if s[0] >= args.warmup] or samples
        print(f"{name:8s} first {settled[0][1] / 2**20:6.1f} MiB  last {settled[-1][1] / 2**20:6.1f} MiB  "
              f"peak {max(v for _, v in samples) / 2**20:6.1f} MiB  growth {slope_per_hour(settled) / 2**20:+.1f} MiB/h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
