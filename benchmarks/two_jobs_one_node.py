"""Two torchrun jobs on one node, each logging through ``| tee JOB.log``; job A deadlocks at
``--stall-step`` while job B trains on (issue 20). Two agents watch them, one given both files with
``--log``, one without, each with its own monitor. Prints, per run, the seconds from A's stall to
its deadlock verdict on each monitor, and whether either ever showed A's ranks past A's stall
(B's steps).

    python benchmarks/two_jobs_one_node.py [--runs 3] [--stall-step 40]

Before the fix, the --log agent credited every --log line to every job on the node: A showed
B's steps and stayed healthy for the 40 s watched.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hangwatch.demo.harness import MonitorClient, Reaper, launch_torchrun, start_agent, start_monitor


def one_run(workdir: Path, stall_step: int, timeout: float) -> dict[str, float | None | bool]:
    with Reaper() as reaper:
        job_b = launch_torchrun(reaper, workdir, ["--steps", "100000"], name="b", tee=True)
        job_a = launch_torchrun(reaper, workdir, ["--fail", "linger", "--fail-at-step", str(stall_step)],
                                name="a", tee=True)
        watchers = {}
        for name, extra in (("with --log", ["--log", str(job_a.logs[0]), "--log", str(job_b.logs[0])]),
                            ("without", [])):
            home = workdir / name.replace(" ", "").replace("-", "")
            home.mkdir()
            monitor = start_monitor(reaper, home)
            start_agent(reaper, home, monitor.url, extra=extra)
            watchers[name] = MonitorClient(monitor.url)
        found: dict[str, float | None | bool] = dict.fromkeys(watchers)
        found["A showed B's steps"] = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(found[n] is None for n in watchers):
            stalled_at = job_a.stall_time()
            for name, client in watchers.items():
                answer = client.job(job_a.job_id) or {}
                steps = [r["step"] for r in answer.get("ranks", []) if r.get("step") is not None]
                if steps and max(steps) > stall_step + 1:
                    found["A showed B's steps"] = True
                if stalled_at is None or found[name] is not None:
                    continue
                if answer.get("verdict") == "deadlock":
                    found[name] = time.time() - stalled_at
            time.sleep(0.2)
        for client in watchers.values():
            client.close()
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stall-step", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args()
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            found = one_run(Path(tmp), args.stall_step, args.timeout)
        print(f"run {run + 1}: " + ", ".join(f"{k}: {v:.1f} s" if isinstance(v, float) and not isinstance(v, bool)
                                             else f"{k}: {v}" for k, v in found.items()), flush=True)
        results.append(found)
    for name in ("with --log", "without"):
        times = [r[name] for r in results if isinstance(r[name], float)]
        if times:
            print(f"{name}: deadlock named {statistics.median(times):.1f} s after the stall (median of {len(times)}; "
                  f"{min(times):.1f}-{max(times):.1f}), never in {len(results) - len(times)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
