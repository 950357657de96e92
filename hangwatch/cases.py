"""The ways the demo, the benchmarks and the tests make a 2-rank gloo job go wrong."""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class DemoCase:
    what: str
    train_args: tuple[str, ...]
    expect: str
    culprits: tuple[int, ...] | None = None
    launcher: str = "torchrun"  # or "plain"
    world_size: int = 2
    nranks: int = 2
    signal: int | None = None  # sent to rank 1 from outside


def demo_cases(stall_step: int) -> dict[str, DemoCase]:
    at = ("--fail-at-step", str(stall_step))
    return {
        "deadlock": DemoCase("rank 1 runs out of data, leaves the loop and lingers; rank 0 waits in all_reduce",
                             ("--fail", "linger", *at), "deadlock", (1,)),
        "collective": DemoCase("rank 0 alone enters a broadcast in save_checkpoint; rank 1 waits in all_reduce",
                               ("--fail", "extra-collective", "--fail-rank", "0", *at), "deadlock", (0,)),
        "ddp": DemoCase("DistributedDataParallel; rank 1 leaves the loop and lingers (rank 0 waits in backward)",
                        ("--ddp", "--fail", "linger", *at), "deadlock", (1,)),
        "async": DemoCase("async all_reduce + work.wait(); rank 1 leaves the loop and lingers",
                          ("--async-allreduce", "--fail", "linger", *at), "deadlock", (1,)),
        "straggler": DemoCase("rank 1 computes for 60 s before its next all_reduce",
                              ("--fail", "straggle", "--busy-seconds", "60", *at), "straggler", (1,)),
        "slow": DemoCase("every rank computes for 60 s between steps (no collective)",
                         ("--fail", "busy-all", "--busy-seconds", "60", *at), "slow_compute"),
        "exit": DemoCase("rank 1 runs out of data and exits 0; rank 0 then fails in all_reduce",
                         ("--fail", "exit", *at), "rank_exited", (1,)),
        "exit-plain": DemoCase("plain launch (no torchrun): rank 1 runs out of data and exits 0",
                               ("--fail", "exit", *at), "rank_exited", (1,), launcher="plain"),
        "error": DemoCase("rank 1 raises an exception",
                          ("--fail", "exit-error", *at), "rank_exited", (1,)),
        "killed": DemoCase("rank 1 is killed with SIGKILL", ("--steps", "100000"), "rank_exited", (1,),
                           signal=signal.SIGKILL),
        "stopped": DemoCase("rank 1 is stopped with SIGSTOP", ("--steps", "100000"), "rank_stopped", (1,),
                            signal=signal.SIGSTOP),
        "rendezvous": DemoCase("WORLD_SIZE=3 but only 2 ranks start: init_process_group waits forever",
                               ("--steps", "100",), "rendezvous_hang", launcher="plain", world_size=3),
        "finish": DemoCase("a clean 150-step run", ("--steps", "150",), "finished", ()),
    }


CASE_NAMES = tuple(demo_cases(40))


def launch_case(case: DemoCase, reaper, workdir, *, name: str = "job"):
    """Start the job of a case (torchrun or plain launch); returns a harness.Job."""
    from hangwatch.harness import launch_plain, launch_torchrun

    if case.launcher == "plain":
        return launch_plain(reaper, workdir, list(case.train_args), world_size=case.world_size,
                            nranks=case.nranks, name=name)
    return launch_torchrun(reaper, workdir, list(case.train_args), nproc=case.nranks, name=name)
