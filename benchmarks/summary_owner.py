"""The owner of one giant job fed by summarising relays, in one process: what a summary costs to take
and what a pass over the merged job costs, at sizes the 2-core dev machine cannot carry end to end.

Each relay's share is a deadlocked job's ranks (all parked in all_reduce but one, which left the loop),
made as rank views, grouped by the relays' own code (monitor/ingest/summary_groups.job_summary) and
encoded as a relay sends them; the owner is the monitor's engine (monitor/engine/service.Monitor) with
an in-memory store: each round it takes every relay's summary (decoded and checked as the route does)
and runs one pass (merge, rules, store). Prints the medians over the rounds and the peak RSS.

    python benchmarks/summary_owner.py --ranks 100000 --relays 16 --rounds 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from monitor.diagnosis.model import Frame, JobView, RankView, Stack
from monitor.engine.service import Monitor
from monitor.ingest.summary_groups import job_summary
from monitor.ingest.summary_wire import Summary, decode_summary, encode_summary
from monitor.storage.store import open_store
from monitor.web.settings import Settings

PER_NODE = 8
ALL_REDUCE = (Frame("all_reduce", "/site-packages/torch/distributed/distributed_c10d.py", 2501),
              Frame("train_step", "/work/train.py", 50), Frame("<module>", "/work/train.py", 90))
LEFT = (Frame("main", "/work/train.py", 131), Frame("<module>", "/work/train.py", 160))


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def rank_view(rank: int, culprit: int, now: float, started: float) -> RankView:
    """A rank 100 s into a deadlock: idle, its last step 120 s ago, its stack half a second old."""
    return RankView(rank=rank, node=f"node{rank // PER_NODE:05d}", pid=10_000 + rank, alive=True, observed_at=now,
                    first_seen_at=started, proc_state="S", state_since=now - 100, cpu_percent=0.5,
                    cpu_level_percent=0.5, idle_since=now - 100, step=100,
                    stack=Stack(now - 0.5, LEFT if rank == culprit else ALL_REDUCE),
                    progress_times=(now - 130, now - 125, now - 120))


def summaries(ranks: int, relays: int, culprit: int, now: float, started: float) -> list[bytes]:
    share = ranks // relays
    out = []
    for k in range(relays):
        views = tuple(rank_view(r, culprit, now, started) for r in range(k * share, (k + 1) * share))
        node_index: dict[str, int] = {}
        job = job_summary(JobView(job_id="giant", world_size=ranks, now=now, first_seen_at=started, ranks=views),
                          node_index, now, now - 120, 1)
        out.append(encode_summary(Summary(relay=f"relay-{k}", sent_at=now, started_at=started,
                                          nodes=list(node_index), jobs=[job])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--relays", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    clock = Clock()
    started, culprit = clock.now - 200, args.ranks // 2 + 321
    settings = Settings.from_raw({"db": ":memory:", "tick_interval_s": 1.0, "confirm_alarms": False,
                                  "max_ranks": args.ranks * 2, "max_world_size": args.ranks * 2})
    monitor = Monitor(open_store(settings, clock), settings, clock=clock)
    take_s, pass_s, cpu_s, sizes = [], [], [], []
    verdict = None
    for _ in range(args.rounds):
        bodies = summaries(args.ranks, args.relays, culprit, clock.now, started)
        sizes.append(sum(map(len, bodies)) / len(bodies))
        cpu0, t0 = time.process_time(), time.perf_counter()
        for body in bodies:
            monitor.ingest_summary(decode_summary(body))
        t1 = time.perf_counter()
        for step in monitor.tick_steps():
            if step is not None:
                step.run()
        take_s.append(t1 - t0)
        pass_s.append(time.perf_counter() - t1)
        cpu_s.append(time.process_time() - cpu0)
        [result] = monitor.results(job_id="giant")
        verdict = (result.diagnosis.verdict, result.diagnosis.culprit_ranks, len(result.view.ranks))
        clock.now += 1.0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.ranks} ranks from {args.relays} relays, {args.rounds} rounds (medians): summary "
          f"{statistics.median(sizes) / 1e6:.2f} MB each; taking them {statistics.median(take_s):.3f} s; a pass "
          f"{statistics.median(pass_s):.2f} s; CPU a round {statistics.median(cpu_s):.2f} s; peak RSS {rss_mib:.0f} MiB")
    print(f"verdict {verdict[0]}, culprits {list(verdict[1])} (expected [{culprit}]), ranks merged {verdict[2]}")


if __name__ == "__main__":
    main()
