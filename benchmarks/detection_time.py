"""Time from the start of a failure to the correct verdict on /diagnose, per case.

    . .venv/bin/activate && python benchmarks/detection_time.py [--repeat 3] [--cases deadlock,exit,...]

For each case a real 2-rank gloo job (hangwatch/demo/workloads/train.py) runs under a real agent
(1 s interval) and a real monitor on loopback. The failure starts at ``--stall-step``; its
time is the workload's ``HANGWATCH-STALL t=`` line (or the moment the benchmark sends
SIGKILL/SIGSTOP, the launch for a world size never reached, the job's end for a clean finish).
Detection is the first /diagnose answer (polled every 0.2 s) with the right verdict and
culprit ranks. Any answer other than ``healthy`` before the failure began is a false alarm.
Prints median/min/max per case; no asserts.

No-alarm cases (checkpoint, eval, first-step, slow-steps, mn-healthy, mn-slow-link) have no
detection time: they are watched for a fixed window from the start of their slow phase and
the table counts the runs with a false alarm (any answer other than the allowed ones) and
the flips: verdict changes away from ``healthy`` in the monitor's own history of the job
(every published change, also those between two polls), per hour of healthy time watched.
To see what alarm confirmation buys, run with ``HANGWATCH_CONFIRM_ALARMS=false`` (the
monitor then publishes every single reading).

Multi-node cases (``mn-*``, root only: they create network namespaces, see tests/netns.py)
run on a fresh pair of simulated nodes each, with one agent per node and the monitor in the
switch namespace; their failure begins at the launch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

from hangwatch.demo.cases import CASE_NAMES, MULTINODE_CASES, demo_cases, launch_case, start_multinode_case
from hangwatch.demo.harness import (
    CaseRun,
    Job,
    MonitorClient,
    Observation,
    Reaper,
    kill_pid,
    start_agent,
    start_monitor,
    stop_gently,
    watch_case,
)

# The multi-node cases' simulated nodes are test machinery (tests/netns.py), not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_CASES = ("deadlock", "collective", "ddp", "async", "exit", "exit-plain", "killed", "stopped",
                 "straggler", "slow", "rendezvous", "finish",
                 "deadlock-heartbeat", "deadlock-sparse-log", "stuck-save",
                 "checkpoint", "eval", "first-step", "slow-steps", "get-future", "bf16", "port-held",
                 "mn-healthy", "mn-firewall", "mn-ifname", "mn-missing-node", "mn-slow-link")
ALL_CASES = CASE_NAMES + tuple(MULTINODE_CASES)


def run_multinode(name: str, wd: Path, timeout: float, poll: float,
                  train_args: tuple[str, ...] = ()) -> tuple[CaseRun, object]:
    """One multi-node case on a fresh fabric; returns (run, case)."""
    import time

    from tests.netns import Fabric

    case = MULTINODE_CASES[name]
    with Fabric(wd) as fabric:
        fabric.start_monitor()
        jobs, job_id = start_multinode_case(name, fabric, train_args)
        client = MonitorClient(fabric.monitor_url, uds=fabric.monitor_uds)
        try:
            if case.quiet:
                probe = type("Q", (), {"quiet": case.quiet, "allowed": ("healthy",), "expect": "healthy"})()
                view = Job(job_id=job_id, kind="torchrun", logs=[j.logs[0] for j in jobs],
                           launcher=jobs[0].launcher)
                run = watch_case(probe, view, client, stall_step=0, timeout=timeout, poll=poll)
                run.history = client.history(job_id)
                return run, case
            run = CaseRun(jobs[0])
            run.stall_at = jobs[0].started_at
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                j = client.job(job_id)
                now = time.time()
                run.observations.append(Observation(now, j and j.get("verdict"),
                                                    tuple(j.get("culprit_ranks", ())) if j else ()))
                if j and j.get("verdict") == case.expect and (
                        case.culprits is None or tuple(sorted(j["culprit_ranks"])) == case.culprits):
                    run.detected_at, run.detected = now, j
                    break
                time.sleep(poll)
            return run, case
        finally:
            client.close()


def flips(run: CaseRun) -> list[tuple[str, list[int]]]:
    """The monitor's recorded changes to a verdict other than healthy (None: no history fetched)."""
    return [(h["verdict"], h.get("culprit_ranks", [])) for h in (run.history or []) if h["verdict"] != "healthy"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated, from: {', '.join(ALL_CASES)}")
    p.add_argument("--stall-step", type=int, default=40)
    p.add_argument("--timeout", type=float, default=60.0, help="per run, from the launch")
    p.add_argument("--json", dest="json_out", default=None, help="also write the raw results here")
    p.add_argument("--log-format", choices=("plain", "mmengine", "json", "hf", "none"),
                   help="every case's workload logs its progress this way (e.g. the quiet cases in a "
                        "format only the learner reads)")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in ALL_CASES]
    if unknown:
        p.error(f"unknown case(s): {', '.join(unknown)}")
    table = demo_cases(args.stall_step)
    if args.log_format:
        table = {name: dataclasses.replace(case, train_args=(*case.train_args, "--log-format", args.log_format))
                 for name, case in table.items()}

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
                    if name in MULTINODE_CASES:
                        sub = wd / f"{name}-{i}"
                        sub.mkdir()
                        extra = ("--log-format", args.log_format) if args.log_format else ()
                        run, case = run_multinode(name, sub, args.timeout, 0.2, extra)
                    else:
                        case = table[name]
                        with Reaper() as reaper:
                            job = launch_case(case, reaper, wd, name=f"{name}-{i}")
                            try:
                                run = watch_case(case, job, client, stall_step=args.stall_step,
                                                 timeout=args.timeout + case.extra_time_s, poll=0.2)
                                if getattr(case, "quiet", 0):
                                    run.history = client.history(job.job_id)
                            finally:
                                if job.orphan_pid:
                                    kill_pid(job.orphan_pid)
                    quiet = bool(getattr(case, "quiet", 0))
                    alarms = run.alarms if quiet else run.alarms_before_stall()
                    interim = sorted({o.verdict for o in run.observations
                                      if o.verdict and run.stall_at and o.at >= run.stall_at
                                      and (run.detected_at is None or o.at < run.detected_at)
                                      and o.verdict != "healthy"})
                    r = {"case": name, "run": i, "expect": case.expect, "culprits": case.culprits,
                         "detected": run.detected is not None,
                         "seconds": None if quiet else run.detection_seconds,
                         "quiet": quiet,
                         "false_alarms": [(round(o.at - (run.stall_at or o.at), 2), o.verdict, o.culprits)
                                          for o in alarms],
                         "interim_verdicts": interim,
                         "flips": flips(run) if quiet else None,
                         "watched_s": (run.observations[-1].at - run.observations[0].at)
                         if quiet and run.observations else None,
                         "final": (run.observations[-1].verdict, run.observations[-1].culprits)
                         if run.observations else None}
                    results[name].append(r)
                    if quiet:
                        secs = "no alarm" if r["detected"] else "FALSE ALARM"
                    else:
                        secs = f"{r['seconds']:.1f}s" if r["seconds"] is not None else "NOT DETECTED"
                    extra = f" false alarms {r['false_alarms']}" if alarms else ""
                    if quiet:
                        extra += f" flips {r['flips']} in {r['watched_s'] or 0:.0f}s"
                    extra += f" interim {interim}" if interim else ""
                    if not r["detected"]:
                        extra += f" last answer {r['final']}"
                    print(f"  run {i} {name:<11} -> {case.expect:<15} {secs}{extra}", flush=True)
        finally:
            client.close()
            stop_gently(agent.proc)
            stop_gently(monitor.proc)

    print("\ncase            verdict          n  detected  median    min    max  false-alarm runs")
    for name in cases:
        rs = results[name]
        secs = [r["seconds"] for r in rs if r["seconds"] is not None and r["detected"]]
        fa = sum(1 for r in rs if r["false_alarms"])
        if secs:
            stats = f"{statistics.median(secs):6.1f} {min(secs):6.1f} {max(secs):6.1f}"
        else:
            stats = f"{'-':>6} {'-':>6} {'-':>6}"
        expect = (MULTINODE_CASES[name] if name in MULTINODE_CASES else table[name]).expect
        if rs and rs[0].get("quiet"):
            stats = f"{'(quiet window)':>20}"
        ndet = sum(1 for r in rs if r["detected"])
        print(f"{name:<15} {expect:<15} {len(rs):2d}  {ndet:2d}/{len(rs):<2d}    {stats}  {fa}")
    quiet_runs = [r for rs in results.values() for r in rs if r["quiet"] and r["watched_s"]]
    if quiet_runs:
        print("\nflips on healthy jobs (verdict changes away from healthy, from the monitor's history)")
        print("case               runs  watched s  flips  flips/hour")
        for name in cases:
            rs = [r for r in results[name] if r["quiet"] and r["watched_s"]]
            if rs:
                watched = sum(r["watched_s"] for r in rs)
                n = sum(len(r["flips"]) for r in rs)
                print(f"{name:<18} {len(rs):4d}  {watched:9.0f}  {n:5d}  {n * 3600 / watched:10.1f}")
        watched = sum(r["watched_s"] for r in quiet_runs)
        n = sum(len(r["flips"]) for r in quiet_runs)
        print(f"{'all':<18} {len(quiet_runs):4d}  {watched:9.0f}  {n:5d}  {n * 3600 / watched:10.1f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
