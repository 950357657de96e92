"""What the status page's incident data costs the monitor at cluster scale: the merged stack tree
(built at each refresh of a job in trouble) and the per-rank state timeline (kept for every job).

    python benchmarks/page_data.py [--ranks 10000] [--repeat 5]

Prints figures; asserts nothing. Stacks are made per rank (fresh objects, as each rank's report
brings its own), so the first build of a tree pays for every dump's outline and the next ones
show the steady cost of a refresh while the dumps stay the same.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import orjson

from monitor.diagnosis import Frame, RankView, Stack
from monitor.engine.rank_timeline import RankTimeline
from monitor.present.stack_tree import stack_tree

STATES = ("running", "writing", "in_collective")


def ranks_with_stacks(n_ranks: int, distinct: int, depth: int) -> list[RankView]:
    ranks = []
    for r in range(n_ranks):
        variant = r % distinct
        frames = tuple(Frame(name=f"f{i}", file=f"/venv/lib/python3.11/site-packages/torch/m{i}.py",
                             line=10 + i + (variant if i == 0 else 0)) for i in range(depth))
        ranks.append(RankView(rank=r, node=f"node-{r // 8}", pid=r, alive=True, observed_at=0.0, first_seen_at=0.0,
                              stack=Stack(taken_at=1.0, frames=frames)))
    return ranks


def tree_figures(n_ranks: int, distinct: int, depth: int, repeat: int) -> None:
    ranks = ranks_with_stacks(n_ranks, distinct, depth)
    started = time.perf_counter()
    tree = stack_tree(ranks, n_ranks)
    first = time.perf_counter() - started
    again = []
    for _ in range(repeat):
        started = time.perf_counter()
        tree = stack_tree(ranks, n_ranks)
        again.append(time.perf_counter() - started)
    size = len(orjson.dumps(tree))
    print(f"stack tree  {n_ranks:>6} ranks, {distinct:>3} distinct stacks x {depth:>2} frames: "
          f"first build {first * 1000:6.0f} ms, refresh median {statistics.median(again) * 1000:6.1f} ms, "
          f"JSON {size / 1024:6.0f} KiB")


def timeline_figures(n_ranks: int, seconds: int, healthy: bool) -> None:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    timeline = RankTimeline()
    started = time.perf_counter()
    for t in range(seconds):  # one diagnosis a second; a healthy rank's activity changes each time
        timeline.record("job", 1000.0 + t, ((r, STATES[(r + t) % 3]) for r in range(n_ranks)), healthy=healthy)
    elapsed = time.perf_counter() - started
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    kept = sum(s.size_diff for s in after.compare_to(before, "filename"))
    print(f"timeline    {n_ranks:>6} ranks, {seconds} s of {'healthy' if healthy else 'troubled'} readings: "
          f"{kept / 2**20:6.1f} MiB kept, {elapsed / seconds * 1000:6.1f} ms a reading")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for distinct, depth in ((2, 40), (8, 60), (100, 96)):
        tree_figures(args.ranks, distinct, depth, args.repeat)
    timeline_figures(args.ranks, 300, healthy=True)
    timeline_figures(args.ranks, 300, healthy=False)


if __name__ == "__main__":
    main()
