"""The agent's own CPU use with a few ranks running, and what it costs the training.

    . .venv/bin/activate && python benchmarks/agent_overhead.py [--ranks 4] [--runs 3] [--duration 30]

Starts ``--ranks`` plain-launched ranks of hangwatch/demo/workloads/train.py (gloo, one thread each,
healthy, logging on every rank). Each run then measures, over ``--duration`` seconds:

* without the agent: the job's throughput (steps/s from rank 0's log);
* with a real monitor and agent (1 s interval; after a warm-up): the throughput again, and the
  agent's CPU from /proc/<agent>/stat — its own utime+stime, and with its reaped children
  (the py-spy dumps it runs) cutime+cstime — as a percent of one core; the monitor's too.

The two phases alternate order between runs. Prints per-run figures and medians; no asserts.

``--hung``: the job deadlocks at step 20 instead (rank 1 leaves the loop and lingers, the others
wait in all_reduce), and each run measures the agent with the job hung: what a stuck job's stack
dumps cost its node (the agent's native py-spy dumps and the Python ones in between).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hangwatch.demo.harness import Job, Reaper, launch_plain, start_agent, start_monitor, stop_gently

TICK = os.sysconf("SC_CLK_TCK")
STEP = re.compile(r"step (\d+)/")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime=14, stime=15, cutime=16, cstime=17
    own = (int(fields[11]) + int(fields[12])) / TICK
    kids = (int(fields[13]) + int(fields[14])) / TICK
    return own, kids


def last_step(job: Job) -> int:
    text = job.logs[0].read_text(errors="replace")
    steps = STEP.findall(text[-4000:])
    return int(steps[-1]) if steps else 0


def throughput(job: Job, duration: float) -> float:
    s0, t0 = last_step(job), time.monotonic()
    time.sleep(duration)
    s1, t1 = last_step(job), time.monotonic()
    return (s1 - s0) / (t1 - t0)


def with_agent(job: Job, wd: Path, duration: float, warmup: float) -> dict:
    with Reaper() as reaper:
        monitor = start_monitor(reaper, wd)
        agent = start_agent(reaper, wd, monitor.url, interval=1.0)
        try:
            time.sleep(warmup)
            a_own0, a_kids0 = cpu_seconds(agent.proc.pid)
            m_own0, _ = cpu_seconds(monitor.proc.pid)
            t0 = time.monotonic()
            steps = throughput(job, duration)
            dt = time.monotonic() - t0
            a_own1, a_kids1 = cpu_seconds(agent.proc.pid)
            m_own1, _ = cpu_seconds(monitor.proc.pid)
        finally:
            stop_gently(agent.proc)
            stop_gently(monitor.proc)
    return {"steps_per_s": steps,
            "agent_cpu_pct": 100 * (a_own1 - a_own0) / dt,
            "agent_with_children_cpu_pct": 100 * ((a_own1 + a_kids1) - (a_own0 + a_kids0)) / dt,
            "monitor_cpu_pct": 100 * (m_own1 - m_own0) / dt}


def hung(args: argparse.Namespace) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="hangwatch-overhead-") as tmp, Reaper() as jobs:
        wd = Path(tmp)
        job = launch_plain(jobs, wd, ["--steps", "10000000", "--log-all-ranks", "--fail", "linger",
                                      "--fail-at-step", "20"], world_size=args.ranks, name="overhead-hung")
        job.wait_for(r"HANGWATCH-STALL", timeout=120)
        print(f"{args.ranks} ranks hung (pids {sorted(job.rank_pids().values())}); {args.runs} runs of "
              f"{args.duration:.0f}s with the agent, after {args.warmup:.0f}s of warm-up", flush=True)
        for i in range(args.runs):
            row = with_agent(job, wd, args.duration, args.warmup)
            rows.append(row)
            print(f"  run {i}: agent {row['agent_cpu_pct']:.1f}% of a core "
                  f"({row['agent_with_children_cpu_pct']:.1f}% with its py-spy children), "
                  f"monitor {row['monitor_cpu_pct']:.1f}%", flush=True)
    print(f"\nmedian over {len(rows)} runs, {args.ranks} hung ranks, agent interval 1 s: agent "
          f"{statistics.median(r['agent_cpu_pct'] for r in rows):.1f}% of one core, "
          f"{statistics.median(r['agent_with_children_cpu_pct'] for r in rows):.1f}% with its py-spy children")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--hung", action="store_true", help="measure the agent beside a deadlocked job")
    args = p.parse_args(argv)
    if args.hung:
        return hung(args)

    rows = []
    with tempfile.TemporaryDirectory(prefix="hangwatch-overhead-") as tmp, Reaper() as jobs:
        wd = Path(tmp)
        job = launch_plain(jobs, wd, ["--steps", "10000000", "--log-all-ranks"], world_size=args.ranks,
                           name="overhead")
        job.wait_for_step(20, timeout=120)
        print(f"{args.ranks} ranks running (pids {sorted(job.rank_pids().values())}); "
              f"{args.runs} runs of {args.duration:.0f}s with and without the agent", flush=True)
        for i in range(args.runs):
            order = ("without", "with") if i % 2 == 0 else ("with", "without")
            row: dict = {}
            for phase in order:
                if phase == "without":
                    time.sleep(2.0)
                    row["base_steps_per_s"] = throughput(job, args.duration)
                else:
                    row.update(with_agent(job, wd, args.duration, args.warmup))
            row["ratio"] = row["steps_per_s"] / row["base_steps_per_s"] if row["base_steps_per_s"] else float("nan")
            rows.append(row)
            print(f"  run {i}: agent {row['agent_cpu_pct']:.1f}% of a core "
                  f"({row['agent_with_children_cpu_pct']:.1f}% with its py-spy children), "
                  f"monitor {row['monitor_cpu_pct']:.1f}%; "
                  f"throughput {row['steps_per_s']:.2f} vs {row['base_steps_per_s']:.2f} steps/s "
                  f"without (ratio {row['ratio']:.3f})", flush=True)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(f"\nmedian over {len(rows)} runs with {args.ranks} ranks, agent interval 1 s:")
    print(f"  agent CPU:                    {med('agent_cpu_pct'):.1f}% of one core")
    print(f"  agent CPU incl. py-spy:       {med('agent_with_children_cpu_pct'):.1f}% of one core")
    print(f"  monitor CPU:                  {med('monitor_cpu_pct'):.1f}% of one core")
    print(f"  throughput with/without agent: {med('ratio'):.3f} "
          f"({med('steps_per_s'):.2f} vs {med('base_steps_per_s'):.2f} steps/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
