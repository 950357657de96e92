"""Real CUDA + NCCL hangs, diagnosed by the real agent and monitor: for a machine with a GPU.

    . .venv/bin/activate && python benchmarks/gpu_cases.py [--nproc 3] [--repeat 1] [--out DIR]
    python benchmarks/gpu_cases.py --device cpu      # the same cases on gloo: a dry run anywhere

Each case starts a small torchrun job of hangwatch/demo/workloads/train.py with ``--device cuda``
(NCCL; several ranks may share one GPU: each poses as its own host, see FIELD-NOTES), under a
real ``hangwatch-agent`` (1 s) reporting to a real ``hangwatch-monitor`` on loopback, and polls
``/diagnose`` until the case's verdict and culprits show (or the timeout). The cases:

* ``linger``: rank 1 leaves the loop and sleeps -> deadlock [1]
* ``exit``: rank 1 leaves the loop and exits 0 -> rank_exited [1]
* ``extra-collective``: rank 0 alone broadcasts -> deadlock [0]; with identical stacks on every
  rank, only NCCL's RAS counts can name rank 0 (the row says whether its evidence was used)
* ``ddp``: DistributedDataParallel, rank 1 lingers -> deadlock [1]
* ``grind``: rank 1 computes on the GPU for 60 s before its next all_reduce -> straggler [1]
* ``finish``: a clean 150-step run -> finished

For each case it writes into ``--out``: the final ``/diagnose`` JSON, the raw answer of NCCL's
RAS service (JSON, when it answers: new recordings for tests/fixtures/nccl) and a
native py-spy dump of rank 0. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agent.nccl_ras import RasError, fetch_status
from hangwatch.demo.harness import (
    MonitorClient,
    Reaper,
    launch_torchrun,
    start_agent,
    start_monitor,
    stop_gently,
    torchrun_workers,
)

STALL_STEP = 30


@dataclass(frozen=True)
class GpuCase:
    what: str
    args: tuple[str, ...]
    verdict: str
    culprits: tuple[int, ...] | None


CASES = {
    "linger": GpuCase("rank 1 leaves the loop and sleeps", ("--fail", "linger"), "deadlock", (1,)),
    "exit": GpuCase("rank 1 leaves the loop and exits 0", ("--fail", "exit"), "rank_exited", (1,)),
    "extra-collective": GpuCase("rank 0 alone broadcasts", ("--fail", "extra-collective", "--fail-rank", "0"),
                                "deadlock", (0,)),
    "ddp": GpuCase("DDP, rank 1 lingers", ("--ddp", "--fail", "linger"), "deadlock", (1,)),
    "grind": GpuCase("rank 1 computes on the GPU for 60 s", ("--fail", "straggle", "--busy-seconds", "60"),
                     "straggler", (1,)),
    "finish": GpuCase("a clean 150-step run", ("--steps", "150"), "finished", ()),
}


def record_ras(out: Path, name: str) -> bool:
    """NCCL's own answer (JSON), for the recordings; False when nothing answers."""
    try:
        raw = fetch_status(("localhost", 28028))
    except (RasError, OSError):
        return False
    (out / f"ras-{name}.json").write_text(raw)
    return True


def record_stack(out: Path, name: str, pid: int) -> None:
    py_spy = shutil.which("py-spy")
    if not py_spy:
        return
    done = subprocess.run([py_spy, "dump", "--native", "--json", "--pid", str(pid)], capture_output=True,
                          text=True, timeout=30)
    if done.returncode == 0:
        (out / f"pyspy-{name}-native.json").write_text(done.stdout)


def run_case(name: str, case: GpuCase, device: str, nproc: int, client: MonitorClient, wd: Path, out: Path,
             timeout: float) -> dict:
    with Reaper() as reaper:
        args = ["--device", device, "--fail-at-step", str(STALL_STEP), "--steps", "100000", *case.args]
        job = launch_torchrun(reaper, wd, args, nproc=nproc, name=name)
        started = time.monotonic()
        stall_at = None
        found = last = None
        while time.monotonic() - started < timeout:
            stall_at = stall_at or job.stall_time()
            if name == "finish" and job.finished() and stall_at is None:
                stall_at = time.time()
            last = client.job(job.job_id) or last
            if last and last.get("verdict") == case.verdict and (
                    case.culprits is None or sorted(last.get("culprit_ranks", [])) == sorted(case.culprits)):
                found = time.time()
                break
            time.sleep(0.25)
        ras = False
        if name != "finish":
            ras = record_ras(out, name)
            workers = torchrun_workers(job.launcher.pid) if job.launcher else {}
            if 0 in workers:
                record_stack(out, name, workers[0])
        (out / f"diagnose-{name}.json").write_text(json.dumps(last, indent=1) + "\n")
        evidence = (last or {}).get("evidence", [])
        return {
            "case": name,
            "expect": f"{case.verdict} {list(case.culprits or [])}",
            "got": f"{(last or {}).get('verdict')} {(last or {}).get('culprit_ranks')}",
            "seconds": round(found - stall_at, 1) if found and stall_at else None,
            "nccl_evidence": any(line.startswith("NCCL RAS") for line in evidence),
            "ras_recorded": ras,
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--nproc", type=int, default=3, help="ranks, all on this machine (they may share one GPU)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--timeout", type=float, default=90.0)
    p.add_argument("--out", default=None, help="where to keep answers and recordings (default: a temp dir)")
    args = p.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        p.error(f"unknown case(s): {', '.join(unknown)}")
    out = Path(args.out or tempfile.mkdtemp(prefix="hangwatch-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hangwatch-gpu-run-") as tmp, Reaper() as session:
        wd = Path(tmp)
        monitor = start_monitor(session, wd)
        agent = start_agent(session, wd, monitor.url, interval=1.0)
        client = MonitorClient(monitor.url)
        try:
            for i in range(args.repeat):
                for name in names:
                    row = run_case(name, CASES[name], args.device, args.nproc, client, wd, out, args.timeout)
                    rows.append(row)
                    print(f"  run {i} {name:<17} expect {row['expect']:<18} got {row['got']:<18} "
                          f"{row['seconds'] if row['seconds'] is not None else 'NOT FOUND'}s "
                          f"nccl evidence={row['nccl_evidence']} ras recorded={row['ras_recorded']}", flush=True)
        finally:
            client.close()
            stop_gently(agent.proc)
            stop_gently(monitor.proc)
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\nanswers and recordings in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
