"""The field's failure catalogue (issue 3), table-style: verdict, culprits, and the words a person needs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from monitor.diagnosis import (
    ExitView,
    Frame,
    HostFacts,
    Interface,
    JobView,
    LauncherView,
    LogPhase,
    OrphanView,
    Socket,
    diagnose,
)
from tests.diagnosis.builders import (
    NOW,
    collective,
    computing,
    evaluating,
    init_pg,
    job,
    launcher_rendezvous,
    native,
    py,
    rank,
    saving_checkpoint,
    sleeping,
    stack,
    steps,
)

STALLED = steps(NOW - 12, 0.1)
NODES = {
    "node-a": HostFacts(interfaces=(Interface("lo", ("127.0.0.1",)), Interface("eth0", ("10.231.0.1",)))),
    "node-b": HostFacts(interfaces=(Interface("lo", ("127.0.0.1",)), Interface("eth0", ("10.231.0.2",)),
                                    Interface("docker0", ("172.17.0.1",)))),
}
NO_BF16 = HostFacts(cpu_flags=frozenset({"avx2", "avx512f"}), cpu_model="Intel i5-12450H")
WITH_AMX = HostFacts(cpu_flags=frozenset({"avx512f", "amx_bf16", "avx512_bf16"}), cpu_model="Xeon 8480")
BF16_LINE = "COMPUTE_DTYPE: torch.bfloat16 (auto-detected: CUDA SM 89)"


def firewall_job() -> JobView:
    blocked = Socket("10.231.0.1:40001", "10.231.0.2:45678", "SYN_SENT", since=NOW - 20)
    store = Socket("10.231.0.2:50000", "10.231.0.1:29500", "ESTABLISHED", since=NOW - 25)
    return job(
        rank(0, frames=init_pg(), first_seen=NOW - 25, sockets=(blocked,)),
        rank(1, frames=init_pg(), first_seen=NOW - 25, node="node-b", sockets=(store,)),
        hosts=NODES,
    )


def wrong_ifname_job() -> JobView:
    to_docker = Socket("10.231.0.1:40001", "172.17.0.1:45678", "SYN_SENT", since=NOW - 20)
    return job(
        rank(0, frames=init_pg(), first_seen=NOW - 25, sockets=(to_docker,),
             env=(("GLOO_SOCKET_IFNAME", "eth0"),)),
        rank(1, frames=init_pg(), first_seen=NOW - 25, node="node-b", env=(("GLOO_SOCKET_IFNAME", "docker0"),)),
        hosts=NODES,
    )


def missing_node_job() -> JobView:
    waiting = LauncherView(node="node-a", pid=77, alive=True, first_seen_at=NOW - 30, node_rank=0, nnodes="2",
                           nproc_per_node="1", master_addr="10.231.0.1", master_port=29500,
                           stack=stack(launcher_rendezvous(), active=False))
    return JobView(job_id="10.231.0.1:29500", world_size=2, now=NOW, first_seen_at=NOW - 30, ranks=(),
                   launchers=(waiting,), hosts=NODES, nodes_reporting=frozenset({"node-a", "node-b"}))


def port_in_use_job() -> JobView:
    failed = LauncherView(node="node-a", pid=78, alive=False, first_seen_at=NOW - 3, master_port=29500,
                          exit=ExitView(NOW - 2, 1),
                          log_errors=("torch.distributed.DistNetworkError: The server socket has failed to "
                                      "listen on any local network address. port: 29500, useIpv6: false, "
                                      "code: -98, name: EADDRINUSE, message: address already in use",))
    stale = OrphanView(node="node-a", pid=4242, cmdline="python -m scripts.base_train --depth 8",
                       listening_ports=(29500,))
    return JobView(job_id="127.0.0.1:29500", world_size=2, now=NOW, first_seen_at=NOW - 3, ranks=(),
                   launchers=(failed,), orphans=(stale,))


def text(result) -> str:
    return "\n".join([result.summary, *result.evidence, *result.hints])


CATALOGUE: list[tuple[str, JobView, str, tuple[int, ...], tuple[str, ...]]] = [
    ("mismatched collectives: the odd call site is named with file:line",
     job(rank(0, frames=collective("broadcast", 114, "save_checkpoint")), rank(1, frames=collective("all_reduce", 103)),
         rank(2, frames=collective("all_reduce", 103)), progress=STALLED),
     "deadlock", (0,), ("broadcast@train.py:114", "ranks 1, 2 wait in all_reduce")),
    ("identical stacks: the rank that stopped progressing first is named",
     job(rank(0, frames=collective("all_reduce", 103), progress=steps(NOW - 12, 0.1)),
         rank(1, frames=collective("all_reduce", 103), progress=steps(NOW - 20, 0.1)), progress=STALLED),
     "deadlock", (1,), ("all stacks identical", "stopped progressing first")),
    ("bf16 on a CPU without native bf16: slow compute, and float32 is the fix",
     job(rank(0, cpu=100, frames=computing(), active=True, compute_dtype="torch.bfloat16", compute_dtype_line=BF16_LINE),
         rank(1, cpu=100, frames=computing() + (native("at::native::cpublas::gemm<c10::BFloat16>"),), active=True),
         progress=STALLED, hosts={"node-a": NO_BF16}),
     "slow_compute", (), ("bfloat16", "neither amx_bf16 nor avx512_bf16", "float32")),
    ("bf16 on a CPU with AMX: said to be fine there",
     job(rank(0, cpu=100, frames=computing(), active=True, compute_dtype="torch.bfloat16", compute_dtype_line=BF16_LINE),
         rank(1, cpu=100, frames=computing(), active=True), progress=STALLED, hosts={"node-a": WITH_AMX}),
     "slow_compute", (), ("amx_bf16", "full speed")),
    ("straggler writing a checkpoint: says what it is doing",
     job(rank(0, cpu=30, frames=saving_checkpoint(), active=True, bytes_per_s=40e6),
         rank(1, frames=collective("barrier", 120)), progress=steps(NOW - 200, 0.1)),
     "straggler", (0,), ("writing a checkpoint", "MB/s")),
    ("worker firewall: SYN-SENT from the master to the worker's gloo port",
     firewall_job(), "rendezvous_hang", (1,), ("10.231.0.2:45678", "SYN-SENT", "node-b", "GLOO_PORT_RANGE")),
    ("gloo on a docker interface: peers try its address",
     wrong_ifname_job(), "rendezvous_hang", (1,), ("GLOO_SOCKET_IFNAME=docker0", "172.17.0.1", "GLOO_SOCKET_IFNAME")),
    ("a node that never joined: torchrun waits with no workers",
     missing_node_job(), "rendezvous_hang", (1,), ("1 of 2 nodes", "node rank(s) 1", "node-b", "next_rendezvous")),
    ("master port held by a stale process",
     port_in_use_job(), "rendezvous_hang", (), ("EADDRINUSE", "pid 4242", "PPID 1", "--master-port")),
    ("ChildFailedError without detail: the error file tells the real error",
     job(rank(0, alive=False, exit=ExitView(NOW - 4.6, None, 15, None)),
         rank(1, alive=False, exit=ExitView(NOW - 5, 1, None, None),
              error_file_message="RuntimeError: simulated failure on rank 1 at step 15\n  File train.py, line 90"),
         progress=STALLED),
     "rank_exited", (1,), ("simulated failure on rank 1", "error file")),
    ("gloo's Work::getFuture crash gets its fix",
     job(rank(0, alive=False, exit=ExitView(NOW - 5, 1, None, "RuntimeError: Work::getFuture not implemented")),
         rank(1, alive=False, exit=ExitView(NOW - 4.9, None, 15, None)), progress=STALLED),
     "rank_exited", (0,), ("get_future", "work.wait()")),
]


@pytest.mark.parametrize(("situation", "job_view", "verdict", "culprits", "words"), CATALOGUE,
                         ids=[c[0] for c in CATALOGUE])
def test_catalogue(situation, job_view, verdict, culprits, words) -> None:
    result = diagnose(job_view)
    assert (result.verdict, result.culprit_ranks) == (verdict, culprits), text(result)
    for word in words:
        assert word in text(result), f"{word!r} missing from:\n{text(result)}"


EVAL_LINE = LogPhase("evaluation", NOW - 3, "eval step 30 batch 4 | val loss 2.3012")

NO_ALARM: list[tuple[str, JobView]] = [
    ("every rank evaluates, known only from its log (no py-spy on the node)",
     job(rank(0, cpu=45, log_phase=EVAL_LINE), rank(1, cpu=45, log_phase=EVAL_LINE),
         progress=steps(NOW - 25, 1.0), stacks_unavailable_reason="py-spy not found")),
    ("every rank evaluates per its log; the stacks, taken in the forward pass, name no phase",
     job(rank(0, cpu=45, frames=computing(), active=True, log_phase=EVAL_LINE),
         rank(1, cpu=45, frames=computing(), active=True, log_phase=EVAL_LINE), progress=steps(NOW - 25, 1.0))),
    ("rank 0 saves a checkpoint for 20 s while the others wait at a barrier",
     job(rank(0, cpu=30, frames=saving_checkpoint(), active=True, bytes_per_s=40e6),
         rank(1, frames=collective("barrier", 120)), rank(2, frames=collective("barrier", 120)), progress=STALLED)),
    ("an evaluation pass on every rank",
     job(rank(0, cpu=100, frames=evaluating(), active=True), rank(1, cpu=100, frames=evaluating(), active=True),
         progress=steps(NOW - 30, 0.1))),
    ("one rank finished its evaluation and waits; the other, CPU-starved, still evaluates",
     job(rank(0, frames=collective("all_reduce", 190, "evaluate")), rank(1, cpu=15, frames=evaluating(), active=False),
         progress=steps(NOW - 20, 0.1))),
    ("70-second steps, 100 s into a step that follows a 90 s one",
     job(rank(0, cpu=100, frames=computing(), active=True), rank(1, frames=collective("all_reduce", 103)),
         progress=(NOW - 400, NOW - 330, NOW - 260, NOW - 190, NOW - 100))),
    ("a slow link: bytes move, steps slow but regular, ranks mostly in all_reduce",
     job(rank(0, frames=collective("all_reduce", 103), bytes_per_s=4e5, collective_wait_share=0.8),
         rank(1, frames=collective("all_reduce", 103), bytes_per_s=4e5, collective_wait_share=0.75),
         progress=steps(NOW - 2, 3.0))),
    # Issue 8's flaps: a checkpoint written in bursts (write, fsync, pause a second) ...
    ("rank 0 pauses between two checkpoint writes (last burst 1.5 s ago), the others at a barrier",
     job(rank(0, cpu=0, frames=saving_checkpoint(), active=False, bytes_per_s=0.0, moved_at=NOW - 1.5),
         rank(1, frames=collective("barrier", 120)), rank(2, frames=collective("barrier", 120)), progress=STALLED)),
    ("the same pause between checkpoint writes with no stack of rank 0 (py-spy not allowed there)",
     job(rank(0, cpu=0, bytes_per_s=0.0, moved_at=NOW - 1.5, idle_since=NOW - 1.5),
         rank(1, frames=collective("barrier", 120)), rank(2, frames=collective("barrier", 120)), progress=STALLED)),
    # ... and the first steps of a job over a slow link, before its pace is known.
    ("12 s first steps over a slow link: parked in all_reduce 12 s after the second step",
     job(rank(0, cpu=2, frames=collective("all_reduce", 103), idle_since=NOW - 12, first_seen=NOW - 40),
         rank(1, cpu=2, frames=collective("all_reduce", 103), idle_since=NOW - 12, first_seen=NOW - 40),
         progress=(NOW - 24, NOW - 12))),
    ("slow link, bytes in bursts below the rate of one sample: the last burst 2 s ago",
     job(rank(0, cpu=2, frames=collective("all_reduce", 103), bytes_per_s=1e5, moved_at=NOW - 2, idle_since=NOW - 2),
         rank(1, cpu=2, frames=collective("all_reduce", 103), bytes_per_s=1e5, moved_at=NOW - 2, idle_since=NOW - 2),
         progress=(NOW - 24, NOW - 12))),
    ("first step under torch.compile: nothing logged yet, everyone busy for a minute",
     job(rank(0, cpu=100, frames=(py("compile_fx", "/venv/lib/python3.11/site-packages/torch/_inductor/compile_fx.py", 1),),
              active=True),
         rank(1, cpu=100, frames=computing(), active=True))),
]


def test_missing_node_without_node_ranks_names_no_rank() -> None:
    job_view = missing_node_job()
    job_view = replace(job_view, launchers=(replace(job_view.launchers[0], node_rank=None),))
    result = diagnose(job_view)
    assert (result.verdict, result.culprit_ranks) == ("rendezvous_hang", ())
    assert "1 of 2 nodes joined" in result.summary


@pytest.mark.parametrize(("situation", "job_view"), NO_ALARM, ids=[c[0] for c in NO_ALARM])
def test_no_false_alarm(situation, job_view) -> None:
    result = diagnose(job_view)
    assert result.verdict in ("healthy", "straggler"), text(result)
    assert result.verdict not in ("deadlock", "stalled")


def no_alarm_case(prefix: str) -> JobView:
    return next(c[1] for c in NO_ALARM if c[0].startswith(prefix))


def test_log_declared_evaluation_is_healthy_and_shows_the_line() -> None:
    result = diagnose(no_alarm_case("every rank evaluates, known only from its log"))
    assert result.verdict == "healthy" and "in an evaluation phase" in result.summary, text(result)
    assert "rank 0 evaluating (says its log)" in result.summary
    assert "rank 1's log since its last step: eval step 30 batch 4 | val loss 2.3012" in result.evidence


def test_checkpoint_phase_is_healthy_within_its_grace() -> None:
    result = diagnose(no_alarm_case("rank 0 saves a checkpoint"))
    assert result.verdict == "healthy" and "checkpoint" in result.summary


def test_communication_bound_job_reports_its_wait_share() -> None:
    result = diagnose(no_alarm_case("a slow link"))
    assert result.verdict == "healthy"
    assert "78%" in result.summary and "communication-bound" in result.summary


def test_nccl_rank_spinning_in_cuda_sync_counts_as_waiting() -> None:
    nccl_wait = (native("cudaStreamSynchronize"), native("c10d::ProcessGroupNCCL::WorkNCCL::synchronize"),
                 Frame("train_step", "/work/job/train.py", 77))
    result = diagnose(job(rank(0, cpu=100, frames=nccl_wait, active=True, gpu_utilization_percent=100.0),
                          rank(1, cpu=3, frames=(py("main", line=130),), gpu_utilization_percent=0.0),
                          progress=STALLED))
    assert (result.verdict, result.culprit_ranks) == ("deadlock", (1,)), text(result)
    assert "GPU 100% busy" in text(result) and "GPU 0% busy" in text(result)


def ifname_crash_job() -> JobView:
    unreachable = "RuntimeError: [../gloo/transport/tcp/socket.cc:142] connect: Network is unreachable"
    return job(
        rank(0, alive=False, exit=ExitView(NOW - 5, 1, None, unreachable)),
        rank(1, frames=init_pg(), node="node-b", env=(("GLOO_SOCKET_IFNAME", "docker0"),)),
        hosts=NODES,
    )


EARLY_LIFE: list[tuple[str, JobView, str, tuple[int, ...], tuple[str, ...]]] = [
    ("launcher reported before its workers: starting, not stalled",
     JobView(job_id="127.0.0.1:29500", world_size=2, now=NOW, first_seen_at=NOW - 2, ranks=(),
             launchers=(LauncherView(node="node-a", pid=77, alive=True, first_seen_at=NOW - 2),)),
     "healthy", (), ("waiting for its workers",)),
    ("slow first step: two steps seen, then 30 s of compute at contended CPU",
     job(rank(0, cpu=30, frames=computing(), active=False), rank(1, cpu=28, frames=computing(), active=False),
         progress=(NOW - 31, NOW - 30)),
     "healthy", (), ()),
    ("fast steps seen in only two log reads (step 40 by then), then a straggler: no warm-up grace",
     job(rank(0, frames=collective("all_reduce", 103)), rank(1, cpu=95, frames=computing(), active=True),
         progress=(NOW - 12, NOW - 11), job_step=40),
     "straggler", (1,), ()),
    ("stuck at the first step, parked in collectives for 12 s: caught despite the warm-up grace",
     job(rank(0, frames=collective("all_reduce", 103), idle_since=NOW - 12),
         rank(1, frames=collective("barrier", 120), idle_since=NOW - 12), progress=(NOW - 13,)),
     "deadlock", (1,), ()),
    ("a tracing stop for 5 s (py-spy's own dumps) is not a stopped rank",
     job(rank(0, cpu=90), rank(1, cpu=90, state="t", state_since=NOW - 5), progress=steps(NOW - 0.1, 0.1)),
     "healthy", (), ()),
    ("stall just past the threshold, no fresh stack yet: waits for the stacks",
     job(rank(0, cpu=0), rank(1, cpu=0), progress=steps(NOW - 7, 0.1)),
     "healthy", (), ("taking stacks",)),
    ("every rank busy just past the threshold, no fresh stack yet: may be an evaluation, waits for the stacks",
     job(rank(0, cpu=45, frames=computing(), stack_at=NOW - 8),
         rank(1, cpu=45, frames=computing(), stack_at=NOW - 8), progress=steps(NOW - 6, 1.0)),
     "healthy", (), ("taking stacks",)),
    ("every rank busy, still no fresh stack well past the threshold: slow compute after all",
     job(rank(0, cpu=45, frames=computing(), stack_at=NOW - 30),
         rank(1, cpu=45, frames=computing(), stack_at=NOW - 30), progress=steps(NOW - 20, 1.0)),
     "slow_compute", (), ("no stack yet",)),
    ("an eval line read before the last step excuses nothing: every rank busy 20 s later is slow compute",
     job(rank(0, cpu=45, frames=computing(), log_phase=replace(EVAL_LINE, seen_at=NOW - 21)),
         rank(1, cpu=45, frames=computing(), log_phase=replace(EVAL_LINE, seen_at=NOW - 21)),
         progress=steps(NOW - 20, 1.0)),
     "slow_compute", (), ()),
    ("rank 1 logged an eval line, then parked outside any phase: its stack outweighs its log",
     job(rank(0, frames=collective("all_reduce", 50)), rank(1, frames=sleeping(), log_phase=EVAL_LINE),
         progress=steps(NOW - 20, 1.0)),
     "deadlock", (1,), ()),
    ("a phase from the log outlasting its grace is a stall again",
     job(rank(0, cpu=45, frames=computing(), log_phase=replace(EVAL_LINE, seen_at=NOW - 150)),
         rank(1, cpu=45, frames=computing(), log_phase=replace(EVAL_LINE, seen_at=NOW - 150)),
         progress=steps(NOW - 200, 1.0)),
     "slow_compute", (), ()),
    ("gloo connect fails on one node because the other uses a docker interface",
     ifname_crash_job(), "rank_exited", (0,), ("GLOO_SOCKET_IFNAME=docker0", "node-b", "Network is unreachable")),
]


@pytest.mark.parametrize(("situation", "job_view", "verdict", "culprits", "words"), EARLY_LIFE,
                         ids=[c[0] for c in EARLY_LIFE])
def test_early_life_and_evidence_gathering(situation, job_view, verdict, culprits, words) -> None:
    result = diagnose(job_view)
    assert (result.verdict, result.culprit_ranks) == (verdict, culprits), text(result)
    for word in words:
        assert word in text(result), f"{word!r} missing from:\n{text(result)}"


def test_a_job_stuck_past_its_startup_allowance_is_still_caught() -> None:
    """12 s between the first steps allows 24 s parked; 30 s parked is a stall."""
    stuck = job(rank(0, cpu=2, frames=collective("all_reduce", 103), idle_since=NOW - 30),
                rank(1, cpu=0, frames=sleeping(), idle_since=NOW - 30),
                progress=(NOW - 42, NOW - 30))
    result = diagnose(stuck)
    assert result.verdict in ("deadlock", "stalled"), text(result)


def test_a_checkpoint_writer_silent_past_the_window_is_no_longer_writing() -> None:
    """The window is short: a rank that stopped writing 10 s ago is idle again."""
    quiet = job(rank(0, cpu=0, frames=sleeping(), active=False, moved_at=NOW - 10, idle_since=NOW - 10),
                rank(1, frames=collective("barrier", 120)), rank(2, frames=collective("barrier", 120)),
                progress=STALLED)
    result = diagnose(quiet)
    assert (result.verdict, result.culprit_ranks) == ("deadlock", (0,)), text(result)



def test_a_launch_that_failed_is_final() -> None:
    """The launcher exited with its error: the monitor publishes it without confirmation."""
    result = diagnose(port_in_use_job())
    assert result.verdict == "rendezvous_hang" and result.final
    assert not diagnose(no_alarm_case("rank 0 saves a checkpoint")).final


def _single_node_launcher(waited_s: float, frames: tuple[Frame, ...] | None) -> JobView:
    launcher = LauncherView(node="node-a", pid=80, alive=True, first_seen_at=NOW - waited_s, node_rank=0, nnodes="1",
                            nproc_per_node="2", master_addr="127.0.0.1", master_port=29500,
                            stack=stack(frames, active=False) if frames is not None else None)
    return JobView(job_id="127.0.0.1:29500", world_size=2, now=NOW, first_seen_at=NOW - waited_s, ranks=(),
                   launchers=(launcher,), hosts=NODES, nodes_reporting=frozenset({"node-a"}))


STARTING_WORKERS = (py("_start_workers", "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/"
                       "local_elastic_agent.py", 300), py("main", "/venv/bin/torchrun", 8))


@pytest.mark.parametrize(("waited_s", "frames", "hang"), [
    # Every node's launcher is up and none waits in rendezvous code: starting its workers (slow on a
    # loaded machine, each importing torch) is no hang for a minute.
    (30, STARTING_WORKERS, False),
    (30, None, False),
    (61, STARTING_WORKERS, True),
    (61, None, True),
    # Still in rendezvous code (the store unreachable, say): a hang after the usual 10 s.
    (11, launcher_rendezvous(), True),
    (9, launcher_rendezvous(), False),
])
def test_a_launcher_with_every_node_joined_is_a_rendezvous_hang_only_when_it_waits_there_or_past_a_minute(
        waited_s: float, frames: tuple[Frame, ...] | None, hang: bool) -> None:
    result = diagnose(_single_node_launcher(waited_s, frames))
    assert (result.verdict == "rendezvous_hang") is hang, (result.verdict, result.summary)
