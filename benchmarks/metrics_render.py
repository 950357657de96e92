"""What one ``/metrics`` scrape costs, without HTTP: render seconds and size.

    python benchmarks/metrics_render.py [--ranks 4000] [--ranks-per-job 4000] [--seconds 12] [--renders 7]
        [--deadlock] [--profile out.prof]

Builds ``--ranks`` ranks in jobs of ``--ranks-per-job`` (8 per simulated node, ``simulated_nodes``;
jobs of 1,024 ranks or fewer export every rank's series, larger ones their culprits') in the monitor's
engine as ``giant_job_profile.py`` does (one delta report per node per simulated second, a pass a
second), then renders the scrape (``scrape_body``, as the route's worker thread does) ``--renders``
times on the same published results, writing every job anew, then as the route does, with the text
kept from the previous scrape (``JobSeries``) and once more after each of a few further passes (the
jobs re-diagnosed). It prints the medians: CPU-seconds of a render, with and without gzip, and the
size of the text. ``--deadlock`` deadlocks the first job (one culprit); ``--profile`` writes a
cProfile of the renders.

It asserts nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
from collections import Counter
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_nodes import cluster  # noqa: E402

from agent.delta import DeltaState  # noqa: E402
from monitor.engine.service import Monitor  # noqa: E402
from monitor.ingest.fastwire import decode_report  # noqa: E402
from monitor.storage.store import Store  # noqa: E402
from monitor.web.http_guard import HttpStats  # noqa: E402
from monitor.web.job_series import JobSeries  # noqa: E402
from monitor.web.load import LoadGuard  # noqa: E402
from monitor.web.metrics import http_families, load_families  # noqa: E402
from monitor.web.routes.metrics import scrape_body  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4_000)
    parser.add_argument("--ranks-per-job", type=int, default=4_000)
    parser.add_argument("--seconds", type=int, default=12, help="simulated seconds of reports before the renders")
    parser.add_argument("--renders", type=int, default=7)
    parser.add_argument("--passes", type=int, default=3, help="further passes, each followed by a render")
    parser.add_argument("--deadlock", action="store_true")
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args()

    nodes = cluster(args.ranks // 8, args.ranks_per_job)
    deltas = {n.name: DeltaState() for n in nodes}
    start = 1_000_000.0
    clock = [start]
    if args.deadlock:  # the first job's rank 1 leaves the loop
        for n in nodes:
            if n.job_id == nodes[0].job_id:
                n.deadlocked_at, n.culprit_rank = start + 1, 1
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "hw.db", clock=lambda: clock[0])
        monitor = Monitor(store, clock=lambda: clock[0], tick_interval_s=1.0)

        def second(now: float) -> None:
            for i, node in enumerate(nodes):
                clock[0] = at = now + i / len(nodes)
                body, baseline = deltas[node.name].compact(node.report(at))
                answer = monitor.ingest(decode_report(json.dumps(body).encode()), at)
                deltas[node.name].delivered(baseline, {"send_full": answer.send_full, "delta": True})
            clock[0] = now + 1
            monitor.tick(now + 1)

        for s in range(args.seconds):
            second(start + s)
        guard, http, kept = LoadGuard(), HttpStats(), JobSeries()

        def render(compress: bool, series: JobSeries | None = None) -> tuple[float, int]:
            results, figures = monitor.results(), monitor.figures()
            suspects = monitor.cached_suspect_nodes()
            t0 = time.process_time()
            body = scrape_body(results, figures, suspects, load_families(guard), http_families(http), compress, series)
            return time.process_time() - t0, len(body)

        profiler = cProfile.Profile() if args.profile else None
        if profiler:
            profiler.enable()
        plain = [render(False) for _ in range(args.renders)]
        gzipped = [render(True) for _ in range(args.renders)]
        render(False, kept)
        kept_text = [render(False, kept) for _ in range(args.renders)]
        after_pass = []
        for s in range(args.passes):
            if profiler:
                profiler.disable()
            second(start + args.seconds + s)
            if profiler:
                profiler.enable()
            after_pass.append(render(False, kept))
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
        verdicts = Counter(r.diagnosis.verdict for r in monitor.results())
        store.close()
    def ms(runs: list[tuple[float, int]]) -> str:
        return f"{statistics.median(t for t, _ in runs) * 1000:.1f} ms"

    print(f"ranks {args.ranks} in jobs of {args.ranks_per_job} ({dict(verdicts)}): every job written "
          f"{ms(plain)} ({plain[0][1] / 1e6:.2f} MB), gzipped {ms(gzipped)} ({gzipped[0][1] / 1e3:.0f} kB); "
          f"text kept, same results {ms(kept_text)}, after a pass {ms(after_pass)}")


if __name__ == "__main__":
    main()
