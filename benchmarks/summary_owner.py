"""The owner of one giant job fed by summarising relays, in one process: what a summary costs to take
and what a pass over the merged job costs, at sizes the 2-core dev machine cannot carry end to end.

Each relay's share is a deadlocked job's ranks (all parked in all_reduce but one, which left the loop),
made as rank views, grouped by the relays' own code (monitor/ingest/summary_groups.job_summary) and
encoded as a relay sends them; the owner is the monitor's engine (monitor/engine/service.Monitor) with
an in-memory store: each round it takes every relay's summary (decoded and checked as the route does)
and runs one pass (merge, rules, store). Prints the medians over the rounds and the peak RSS.

    python benchmarks/summary_owner.py --ranks 100000 --relays 16 --rounds 5

``--timeline`` plays a job from healthy training into a deadlock instead: each node's agent reports
every ``--report-interval`` seconds (nodes staggered), each relay summarises its nodes' latest reports
once a simulated second, and the owner's clock moves on by a second or by what the round cost it,
whichever is longer (a pass that takes 2.5 s delays the next by that much). Prints when the deadlock
and its culprit were named (seconds after the fault), every verdict on the way, and the owner's CPU
per simulated second.

    python benchmarks/summary_owner.py --timeline --ranks 100000 --report-interval 10
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
from monitor.web.gc_tuning import GcTamer
from monitor.web.settings import Settings

PER_NODE = 8
ALL_REDUCE = (Frame("all_reduce", "/site-packages/torch/distributed/distributed_c10d.py", 2501),
              Frame("train_step", "/work/train.py", 50), Frame("<module>", "/work/train.py", 90))
LEFT = (Frame("main", "/work/train.py", 131), Frame("<module>", "/work/train.py", 160))
COMPUTE = (Frame("forward", "/site-packages/torch/nn/modules/linear.py", 125),
           Frame("train_step", "/work/train.py", 47), Frame("<module>", "/work/train.py", 90))


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


def summary_body(relay: int, views: tuple[RankView, ...], world: int, now: float, started: float,
                 last_progress_at: float, progress: tuple[float, ...] = ()) -> bytes:
    """Relay ``relay``'s summary of ``views``, grouped and encoded by the relays' own code."""
    node_index: dict[str, int] = {}
    job = job_summary(JobView(job_id="giant", world_size=world, now=now, first_seen_at=started, ranks=views,
                              job_progress_times=progress), node_index, now, last_progress_at, 1)
    return encode_summary(Summary(relay=f"relay-{relay}", sent_at=now, started_at=started,
                                  nodes=list(node_index), jobs=[job]))


def summaries(ranks: int, relays: int, culprit: int, now: float, started: float) -> list[bytes]:
    share = ranks // relays
    return [summary_body(k, tuple(rank_view(r, culprit, now, started) for r in range(k * share, (k + 1) * share)),
                         ranks, now, started, now - 120) for k in range(relays)]


def reported_at(rank: int, now: float, interval: float) -> float:
    """When the rank's node last reported: nodes report every ``interval`` s, staggered by node."""
    phase = (rank // PER_NODE) * 0.6180339 % 1.0 * interval
    return now - ((now - phase) % interval)


def cpu_level(at: float, fault: float, interval: float) -> float:
    """The median of the rank's CPU samples over the monitor's 30-s window, a sample a report."""
    samples = sorted(99.0 if at - i * interval < fault else 0.5 for i in range(int(30 // interval) + 1))
    return statistics.median(samples)


def live_view(rank: int, culprit: int, at: float, started: float, fault: float, interval: float) -> RankView:
    """The rank as its node's report at ``at`` had it: a step a second until ``fault``, then parked in
    all_reduce (the culprit left the loop)."""
    node, pid = f"node{rank // PER_NODE:05d}", 10_000 + rank
    if at < fault:
        last = float(int(at))
        return RankView(rank=rank, node=node, pid=pid, alive=True, observed_at=at, first_seen_at=started,
                        proc_state="R", state_since=started, cpu_percent=99.0, cpu_level_percent=99.0,
                        step=int(last - started), stack=Stack(at - 0.5, COMPUTE),
                        progress_times=(last - 2, last - 1, last))
    last = float(int(fault))
    return RankView(rank=rank, node=node, pid=pid, alive=True, observed_at=at, first_seen_at=started,
                    proc_state="S", state_since=fault + 0.5, cpu_percent=0.5,
                    cpu_level_percent=cpu_level(at, fault, interval), idle_since=fault + 0.5,
                    step=int(last - started), stack=Stack(at - 0.5, LEFT if rank == culprit else ALL_REDUCE),
                    progress_times=(last - 2, last - 1, last))


def timeline(args: argparse.Namespace, settings: Settings) -> None:
    clock = Clock()
    started, culprit = clock.now, args.ranks // 2 + 321
    fault = started + args.healthy_s
    monitor = Monitor(open_store(settings, clock), settings, clock=clock)
    share = args.ranks // args.relays
    tamer = GcTamer(last_full_at=clock.now)
    seen: list[tuple[float, str, tuple[int, ...]]] = []
    named_at, rounds = None, []
    while clock.now < fault + args.deadline_s and named_at is None:
        now = clock.now
        bodies = []
        for k in range(args.relays):
            views = tuple(live_view(r, culprit, reported_at(r, now, args.report_interval), started, fault,
                                    args.report_interval)
                          for r in range(k * share, (k + 1) * share))
            progress = tuple(float(t) for t in range(int(min(now, fault)) - 5, int(min(now, fault)) + 1))
            bodies.append(summary_body(k, views, args.ranks, now, started, progress[-1], progress))
        cpu0 = time.process_time()
        for body in bodies:
            monitor.ingest_summary(decode_summary(body))
        for step in monitor.tick_steps():
            if step is not None:
                step.run()
        tamer.after_pass(now)
        cpu = time.process_time() - cpu0
        rounds.append(cpu)
        [result] = monitor.results(job_id="giant")
        found = (result.diagnosis.verdict, tuple(result.diagnosis.culprit_ranks))
        if not seen or seen[-1][1:] != found:
            seen.append((now - fault, *found))
        if now >= fault and found == ("deadlock", (culprit,)):
            named_at = now - fault
        clock.now += max(1.0, cpu)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.ranks} ranks from {args.relays} relays, each node reporting every {args.report_interval:g} s; "
          f"owner CPU {sum(rounds) / (clock.now - started):.2f} s a simulated second; a round (summaries taken, "
          f"one pass) median {statistics.median(rounds):.2f} s, max {max(rounds):.2f} s; peak RSS {rss:.0f} MiB")
    for at, verdict, culprits in seen:
        print(f"  {at:+7.1f} s  {verdict} {list(culprits)[:8]}")
    print(f"deadlock and culprit [{culprit}] named {named_at:.1f} s after the fault" if named_at is not None
          else f"deadlock and culprit not named within {args.deadline_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--relays", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeline", action="store_true", help="play healthy training into a deadlock")
    parser.add_argument("--report-interval", type=float, default=10.0, help="each node's report interval (timeline)")
    parser.add_argument("--healthy-s", type=float, default=40.0, help="seconds of training before the fault (timeline)")
    parser.add_argument("--deadline-s", type=float, default=60.0, help="give up this long after the fault (timeline)")
    parser.add_argument("--confirm-alarms", action="store_true", help="confirm alarms as a deployment does")
    args = parser.parse_args()
    settings = Settings.from_raw({"db": ":memory:", "tick_interval_s": 1.0, "confirm_alarms": args.confirm_alarms,
                                  "max_ranks": args.ranks * 2, "max_world_size": args.ranks * 2})
    if args.timeline:
        timeline(args, settings)
        return
    clock = Clock()
    started, culprit = clock.now - 200, args.ranks // 2 + 321
    monitor = Monitor(open_store(settings, clock), settings, clock=clock)
    tamer = GcTamer(last_full_at=clock.now)
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
        tamer.after_pass(clock.now)
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
