"""Time from the start of a failure to the correct verdict on /diagnose, per case.

    . .venv/bin/activate && python benchmarks/detection_time.py [--repeat 3] [--cases deadlock,exit,...]

For each case a real 2-rank gloo job (hangwatch/workloads/train.py) runs under a real agent
(1 s interval) and a real monitor on loopback. The failure starts at ``--stall-step``; its
time is the workload's ``HANGWATCH-STALL t=`` line (or the moment the benchmark sends
SIGKILL/SIGSTOP, the launch for a world size never reached, the job's end for a clean finish).
Detection is the first /diagnose answer (polled every 0.2 s) with the right verdict and
culprit ranks. Any answer other than ``healthy`` before the failure began is a false alarm.
Prints median/min/max per case; no asserts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from hangwatch.cases import CASE_NAMES, demo_cases, launch_case
from hangwatch.harness import MonitorClient, Reaper, start_agent, start_monitor, stop_gently, watch_case

DEFAULT_CASES = ("deadlock", "collective", "ddp", "async", "exit", "exit-plain", "killed", "stopped",
                 "straggler", "slow", "rendezvous", "finish")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated, from: {', '.join(CASE_NAMES)}")
    p.add_argument("--stall-step", type=int, default=40)
    p.add_argument("--timeout", type=float, default=60.0, help="per run, from the launch")
    p.add_argument("--json", dest="json_out", default=None, help="also write the raw results here")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASE_NAMES]
    if unknown:
        p.error(f"unknown case(s): {', '.join(unknown)}")
    table = demo_cases(args.stall_step)

    results: dict[str, list[dict]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="hangwatch-bench-") as tmp, Reaper() as session:
        wd = Path(tmp)
        monitor = start_monitor(session, wd)
        agent = start_agent(session, wd, monitor.url, interval=1.0)
        client = MonitorClient(monitor.url)
        print(f"monitor {monitor.url}, agent pid {agent.proc.pid}; {len(cases)} cases x {args.repeat}",
              flush=True)
        try:
            for i in range(args.repeat):
                for name in cases:
                    case = table[name]
                    with Reaper() as reaper:
                        job = launch_case(case, reaper, wd, name=f"{name}-{i}")
                        run = watch_case(case, job, client, stall_step=args.stall_step,
                                         timeout=args.timeout, poll=0.2)
                    alarms = run.alarms_before_stall()
                    interim = sorted({o.verdict for o in run.observations
                                      if o.verdict and run.stall_at and o.at >= run.stall_at
                                      and (run.detected_at is None or o.at < run.detected_at)
                                      and o.verdict != "healthy"})
                    r = {"case": name, "run": i, "expect": case.expect, "culprits": case.culprits,
                         "detected": run.detected is not None,
                         "seconds": run.detection_seconds,
                         "false_alarms": [(round(o.at - (run.stall_at or o.at), 2), o.verdict, o.culprits)
                                          for o in alarms],
                         "interim_verdicts": interim,
                         "final": (run.observations[-1].verdict, run.observations[-1].culprits)
                         if run.observations else None}
                    results[name].append(r)
                    secs = f"{r['seconds']:.1f}s" if r["seconds"] is not None else "NOT DETECTED"
                    extra = f" false alarms {r['false_alarms']}" if alarms else ""
                    extra += f" interim {interim}" if interim else ""
                    if not r["detected"]:
                        extra += f" last answer {r['final']}"
                    print(f"  run {i} {name:<11} -> {case.expect:<15} {secs}{extra}", flush=True)
        finally:
            client.close()
            stop_gently(agent.proc)
            stop_gently(monitor.proc)

    print("\ncase         verdict          n  detected  median    min    max  false-alarm runs")
    for name in cases:
        rs = results[name]
        secs = [r["seconds"] for r in rs if r["seconds"] is not None and r["detected"]]
        fa = sum(1 for r in rs if r["false_alarms"])
        if secs:
            stats = f"{statistics.median(secs):6.1f} {min(secs):6.1f} {max(secs):6.1f}"
        else:
            stats = f"{'-':>6} {'-':>6} {'-':>6}"
        print(f"{name:<12} {table[name].expect:<15} {len(rs):2d}  {len(secs):2d}/{len(rs):<2d}    {stats}  {fa}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
