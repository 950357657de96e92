"""Where a giant job's time goes inside the monitor, without HTTP: ingest and diagnosis passes.

    python benchmarks/giant_job_profile.py [--ranks 10000] [--seconds 20] [--full] [--profile out.prof]

Builds one job of ``--ranks`` ranks (8 per simulated node, ``simulated_nodes``), feeds the
monitor's ``Monitor.ingest`` one delta report (``--full``: a full one) per node per simulated second (decoded by the
monitor's own decoder, as the ingest route does) and runs its diagnosis pass once a simulated
second, as the background tick does. A deadlock is injected half-way. It prints CPU-ms per
report, per pass and per read of the job's answer, and the simulated seconds until the
deadlock's culprit is named. With ``--profile`` it writes a cProfile of the whole run.

It asserts nothing: it is the quick loop for profiling; ``monitor_scale.py`` is the real figure.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_nodes import cluster  # noqa: E402

from agent.delta import DeltaState  # noqa: E402
from monitor.present.job_answer import job_dict  # noqa: E402
from monitor.ingest.fastwire import decode_report  # noqa: E402
from monitor.engine.service import Monitor  # noqa: E402
from monitor.storage.store import Store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--full", action="store_true",
                        help="every report full, as agents before deltas (or every agent after a restart) send")
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--profile-what", choices=("all", "passes"), default="all",
                        help="profile the whole run, or only the diagnosis passes and reads")
    args = parser.parse_args()

    nodes = cluster(args.ranks // 8, args.ranks)
    deltas = {n.name: DeltaState() for n in nodes}
    start = 1_000_000.0
    clock = [start]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "hw.db", clock=lambda: clock[0])
        monitor = Monitor(store, clock=lambda: clock[0], tick_interval_s=1.0)
        inject_at = start + args.seconds / 2
        culprit = nodes[len(nodes) // 2].first_rank + 3
        ingest_ms: list[float] = []
        pass_ms: list[float] = []
        read_ms: list[float] = []
        found_at = None
        profiler = cProfile.Profile() if args.profile else None
        if profiler and args.profile_what == "all":
            profiler.enable()
        for second in range(args.seconds):
            now = start + second
            if now >= inject_at and nodes[0].deadlocked_at is None:
                for n in nodes:
                    n.deadlocked_at, n.culprit_rank = inject_at, culprit
            started = time.process_time()
            for i, node in enumerate(nodes):
                at = now + i / len(nodes)
                clock[0] = at
                full = node.report(at)
                body, baseline = (full, None) if args.full else deltas[node.name].compact(full)
                report = decode_report(json.dumps(body).encode())
                t0 = time.process_time()
                answer = monitor.ingest(report, at)
                ingest_ms.append((time.process_time() - t0) * 1000)
                if not args.full:
                    deltas[node.name].delivered(baseline, {"send_full": answer.send_full, "delta": True})
            clock[0] = now + 1
            if profiler and args.profile_what == "passes":
                profiler.enable()
            t0 = time.process_time()
            monitor.tick(now + 1)
            pass_ms.append((time.process_time() - t0) * 1000)
            gc.freeze()  # as the monitor's tick does after each pass (monitor/web/gc_tuning.py)
            t0 = time.process_time()
            result = monitor.results(job_id=nodes[0].job_id)[0]
            job_dict(result)
            read_ms.append((time.process_time() - t0) * 1000)
            if profiler and args.profile_what == "passes":
                profiler.disable()
            d = result.diagnosis
            if found_at is None and now + 1 > inject_at and d.verdict == "deadlock" and culprit in d.culprit_ranks:
                found_at = now + 1 - inject_at
            print(f"t={second + 1:3d}s verdict={d.verdict:10s} culprits={list(d.culprit_ranks)[:5]} "
                  f"second={1000 * (time.process_time() - started):.0f} ms", flush=True)
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
        store.close()
    print(f"ranks {args.ranks}: ingest CPU-ms per report median {statistics.median(ingest_ms):.2f}, "
          f"mean {statistics.fmean(ingest_ms):.2f}; pass median {statistics.median(pass_ms):.0f} ms, "
          f"max {max(pass_ms):.0f} ms; read median {statistics.median(read_ms):.0f} ms; "
          f"deadlock found {found_at if found_at is not None else 'never'} s after it began")


if __name__ == "__main__":
    main()
