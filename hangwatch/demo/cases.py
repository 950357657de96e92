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
    # No-alarm cases (expect "healthy"): watch this many seconds from the start of the slow
    # phase; any answer outside ``allowed`` in that time is a false alarm.
    quiet: float = 0.0
    allowed: tuple[str, ...] = ("healthy",)
    orphan_port: bool = False  # a PPID-1 process listens on the master port before the launch
    # Seconds the case needs beyond a watch's usual timeout (a stall reached late in the run).
    extra_time_s: float = 0.0


def demo_cases(stall_step: int) -> dict[str, DemoCase]:
    at = ("--fail-at-step", str(stall_step))
    return {
        "deadlock": DemoCase("rank 1 runs out of data, leaves the loop and lingers; rank 0 waits in all_reduce",
                             ("--fail", "linger", *at), "deadlock", (1,)),
        # -- issue 18: the same deadlock in log formats no built-in pattern knows (learned)
        "deadlock-mmengine": DemoCase("as deadlock, the steps logged as mmengine does ('Iter(train) [  40/1000]')",
                                      ("--log-format", "mmengine", "--fail", "linger", *at), "deadlock", (1,)),
        "straggler-nolog": DemoCase("as straggler, in a job that logs no step lines at all",
                                    ("--log-format", "none", "--fail", "straggle", "--busy-seconds", "60", *at),
                                    "straggler", (1,)),
        "deadlock-nolog": DemoCase("as deadlock, in a job that logs no progress at all",
                                   ("--log-format", "none", "--fail", "linger", *at), "deadlock", (1,)),
        "deadlock-json": DemoCase("as deadlock, the steps logged as JSON lines ('{\"iter\": 40, ...}')",
                                  ("--log-format", "json", "--fail", "linger", *at), "deadlock", (1,)),
        "deadlock-hf": DemoCase("as deadlock, progress logged as transformers' Trainer does, with no step number "
                                "(\"{'loss': 0.61, ..., 'epoch': 0.04}\"): a heartbeat",
                                ("--log-format", "hf", "--fail", "linger", *at), "deadlock", (1,)),
        "deadlock-ownlog": DemoCase("as deadlock, rank 0 logging its steps through logging.FileHandler to a file "
                                    "of its own, none on stdout (the agent given no --log)",
                                    ("--log-file", "{workdir}/rank0-own.log", "--fail", "linger", *at), "deadlock", (1,)),
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
        # -- issue 3: the field's catalogue on one node
        "checkpoint": DemoCase("rank 0 writes a checkpoint for 20 s while rank 1 waits at dist.barrier()",
                               ("--fail", "checkpoint", "--fail-rank", "0", "--busy-seconds", "20", *at),
                               "healthy", quiet=25.0, allowed=("healthy", "straggler")),
        # -- issue 8: healthy jobs whose verdict used to flap for a poll
        "checkpoint-bursts": DemoCase("rank 0 saves for 20 s in bursts (4 MB, fsync, 1 s pause); rank 1 at dist.barrier()",
                                      ("--fail", "checkpoint", "--fail-rank", "0", "--busy-seconds", "20",
                                       "--checkpoint-burst-mb", "4", "--checkpoint-pause", "1", *at),
                                      "healthy", quiet=25.0, allowed=("healthy",)),
        "eval": DemoCase("every rank runs a 15 s evaluation pass (printing eval lines)",
                         ("--fail", "eval", "--busy-seconds", "15", "--eval-every", str(stall_step)),
                         "healthy", quiet=20.0),
        "first-step": DemoCase("step 1 takes 20 s on every rank (a torch.compile-like warm-up)",
                               ("--first-step-seconds", "20"), "healthy", quiet=25.0),
        "slow-steps": DemoCase("every step takes 8 s", ("--step-seconds", "8"), "healthy", quiet=25.0),
        "get-future": DemoCase("reduce_scatter(async_op=True).get_future() on gloo: every rank raises",
                               ("--fail", "get-future", *at), "rank_exited"),
        "bf16": DemoCase("bf16 compute on a CPU (COMPUTE_DTYPE: torch.bfloat16), every rank busy 60 s",
                         ("--dtype", "bfloat16", "--fail", "busy-all", "--busy-seconds", "60", *at),
                         "slow_compute"),
        # -- issue 17: a straggler in a job that keeps stepping, and its control
        "slow-rank": DemoCase("from step 300 rank 1 does 30% more work per step (0.13 s, the others 0.1 s); "
                              "the job keeps stepping at its pace",
                              ("--steps", "100000", "--step-seconds", "0.1", "--step-sleep", "0.01",
                               "--fail", "slow-rank", "--fail-at-step", "300"), "straggler", (1,)),
        "even-steps": DemoCase("every rank computes 0.1 s a step, for 45 s: the same work, never a straggler",
                               ("--steps", "100000", "--step-seconds", "0.1", "--step-sleep", "0.01"),
                               "healthy", quiet=45.0),
        # -- issue 32: what the ranks do outranks what the job prints
        "deadlock-heartbeat": DemoCase("as deadlock, every rank also printing '[hb] rank R beat N uptime Ts' from a "
                                       "side thread twice a second (a counter that never stops)",
                                       ("--heartbeat-every", "0.5", "--fail", "linger", *at), "deadlock", (1,)),
        "deadlock-sparse-log": DemoCase("as deadlock, in a job that logs its step every 100 steps (~16 s apart, as "
                                        "Megatron-LM's --log-interval 100)",
                                        ("--log-every", "100", "--step-sleep", "0.15", "--fail", "linger",
                                         "--fail-at-step", "450"), "deadlock", (1,), extra_time_s=90.0),
        "stuck-save": DemoCase("rank 0's torch.save never returns (its open blocks, as on a hung network mount); "
                               "rank 1 waits at dist.barrier()",
                               ("--fail", "stuck-save", "--fail-rank", "0", "--checkpoint-dir", "{workdir}", *at),
                               "deadlock", (0,)),
        "eval-alone-sparse-log": DemoCase("rank 0 evaluates for 20 s on its own while rank 1 waits at dist.barrier(), "
                                          "in a job that logs every 100 steps and prints a side thread's counter",
                                          ("--log-every", "100", "--heartbeat-every", "0.5", "--fail", "eval-alone",
                                           "--fail-rank", "0", "--busy-seconds", "20", "--compute-share", "0.5",
                                           "--fail-at-step", "250"), "healthy", quiet=25.0),
        "port-held": DemoCase("an orphan (PPID 1) holds MASTER_PORT: torchrun fails with EADDRINUSE",
                              ("--steps", "50"), "rendezvous_hang", orphan_port=True),
    }


CASE_NAMES = tuple(demo_cases(40))


def launch_case(case: DemoCase, reaper, workdir, *, name: str = "job"):
    """Start the job of a case (torchrun or plain launch); returns a harness.Job.

    For ``orphan_port`` cases the orphan's pid is in ``job.orphan_pid``: kill it with
    ``harness.kill_pid`` when done.
    """
    from hangwatch.demo.harness import free_port, launch_plain, launch_torchrun, start_orphan_listener

    # "{workdir}" in a case's arguments: a file of the run's own (a log the job writes itself).
    train_args = [arg.replace("{workdir}", str(workdir)) for arg in case.train_args]
    if case.launcher == "plain":
        return launch_plain(reaper, workdir, train_args, world_size=case.world_size,
                            nranks=case.nranks, name=name)
    port = None
    orphan = None
    if case.orphan_port:
        port = free_port()
        orphan = start_orphan_listener(port)
    job = launch_torchrun(reaper, workdir, train_args, nproc=case.nranks, name=name, port=port)
    job.orphan_pid = orphan
    return job


# ---------------------------------------------------------------- simulated nodes (tests/netns.py)


@dataclass(frozen=True)
class MultiNodeCase:
    what: str
    expect: str
    culprits: tuple[int, ...] | None = None
    quiet: float = 0.0  # no-alarm case: watch this long after the first step


MULTINODE_CASES: dict[str, MultiNodeCase] = {
    "mn-healthy": MultiNodeCase("2 nodes x 1 rank, healthy", "healthy", quiet=20.0),
    "mn-firewall": MultiNodeCase("worker's iptables drops the master's new gloo connections",
                                 "rendezvous_hang", (1,)),
    # Observed: the master's gloo connect fails at once ("Network is unreachable") and rank 0
    # exits; the evidence then names node-b's GLOO_SOCKET_IFNAME=docker0.
    "mn-ifname": MultiNodeCase("worker's GLOO_SOCKET_IFNAME names an unreachable virtual NIC (docker0)",
                               "rank_exited", (0,)),
    "mn-missing-node": MultiNodeCase("node rank 1 never starts", "rendezvous_hang"),
    "mn-slow-link": MultiNodeCase("4 Mbit/s link (tbf), all_reduce dominates the step", "healthy", quiet=30.0),
    # Issue 8: ~12 s steps from the first one on, at low CPU, below 256 KiB/s: the pace is not
    # known for the first half minute and the bytes trickle.
    "mn-slow-start": MultiNodeCase("2 Mbit/s link (tbf), ~12 s steps from the first step on", "healthy",
                                   quiet=40.0),
}

MASTER_HOST, WORKER_HOST, MASTER_PORT = 20, 10, 29500


def start_multinode_case(name: str, fabric, train_args: tuple[str, ...] = ()) -> tuple[list, str]:
    """Set up the nodes of a multi-node case on a created Fabric (monitor started) and launch.

    node-a (10.231.0.20) is the master, node-b (10.231.0.10) the worker: the master has the
    larger address, so it is the side of the gloo pair that dials. ``train_args`` go to the
    workload after the case's own (``--log-format mmengine``). Returns (jobs, job id).
    """
    a = fabric.add_node("a", host=MASTER_HOST)
    b = fabric.add_node("b", host=WORKER_HOST)
    for node in (a, b):
        node.start_agent(fabric.monitor_url)
    args = ["--steps", "100000"]
    env_b = {"GLOO_SOCKET_IFNAME": "eth0"}
    if name == "mn-firewall":
        b.iptables("-A", "INPUT", "-s", a.addr, "-p", "tcp", "--dport", "1024:65535", "-m", "conntrack",
                   "--ctstate", "NEW", "-j", "DROP")
    elif name == "mn-ifname":
        b.sh("ip", "link", "add", "docker0", "type", "bridge")
        b.sh("ip", "addr", "add", "10.230.0.10/24", "dev", "docker0")
        b.sh("ip", "link", "set", "docker0", "up")
        env_b = {"GLOO_SOCKET_IFNAME": "docker0"}
    elif name in ("mn-slow-link", "mn-slow-start"):
        rate, hidden = ("4mbit", "384") if name == "mn-slow-link" else ("2mbit", "850")
        for node in (a, b):
            node.tc("qdisc", "add", "dev", node.ifname, "root", "tbf", "rate", rate, "burst", "32kbit",
                    "latency", "400ms")
        args += ["--hidden", hidden, "--step-sleep", "0"]
    args += list(train_args)
    common = dict(nnodes=2, master_addr=a.addr, master_port=MASTER_PORT)
    jobs = [a.torchrun(args, node_rank=0, env={"GLOO_SOCKET_IFNAME": "eth0"}, **common)]
    if name != "mn-missing-node":
        jobs.append(b.torchrun(args, node_rank=1, env=env_b, **common))
    return jobs, f"{a.addr}:{MASTER_PORT}"
