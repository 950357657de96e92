"""The diagnosis, table-style: one row per situation, no processes."""

from __future__ import annotations

import signal

import pytest

from monitor.diagnosis import VERDICTS, ExitView, JobView, diagnose
from monitor.diagnosis.verdict import PARKED_WITHOUT_PROGRESS_S
from tests.diagnosis.builders import (
    NOW,
    async_wait_native,
    collective,
    computing,
    ddp_backward,
    evaluating,
    init_pg,
    job,
    rank,
    saving_checkpoint,
    sleeping,
    steps,
)

STALLED = steps(NOW - 12, 0.1)  # sub-second steps that stopped 12 s ago
RUNNING = steps(NOW - 0.1, 0.1)  # still advancing
PEER_CLOSED = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4711"

CASES: list[tuple[str, JobView, str, tuple[int, ...]]] = [
    ("healthy sub-second steps",
     job(rank(0, cpu=98, frames=computing(), active=True), rank(1, cpu=97), progress=RUNNING),
     "healthy", ()),
    ("70-second steps, 60 s since the last one: not stuck",
     job(rank(0, cpu=0, frames=collective("all_reduce", 50)), rank(1, cpu=100, frames=computing(), active=True),
         progress=steps(NOW - 60, 70, 10)),
     "healthy", ()),
    ("slow first step: nothing logged yet, everyone busy",
     job(rank(0, cpu=100, frames=computing(), active=True), rank(1, cpu=100, frames=computing(), active=True)),
     "healthy", ()),
    ("rank 1 left the loop and lingers",
     job(rank(0, frames=collective("all_reduce", 50)), rank(1, frames=sleeping()), progress=STALLED),
     "deadlock", (1,)),
    ("rank-0-only barrier, rank 1 in the step's all_reduce",
     job(rank(0, frames=collective("barrier", 80, "save_checkpoint")), rank(1, frames=collective("all_reduce", 50)),
         progress=STALLED),
     "deadlock", (0,)),
    ("two all_reduce call sites: the job's known sync point wins the tie",
     job(rank(0, frames=collective("all_reduce", 91, "log_metrics")), rank(1, frames=collective("all_reduce", 50)),
         progress=STALLED, known_wait_sites=frozenset({"all_reduce@train.py:50"})),
     "deadlock", (0,)),
    ("three ranks: the minority is the odd one out",
     job(rank(0, frames=collective("broadcast", 85)), rank(1, frames=collective("broadcast", 85)),
         rank(2, frames=collective("all_reduce", 50)), progress=STALLED),
     "deadlock", (2,)),
    ("DDP: a peer waits inside backward, rank 1 lingers",
     job(rank(0, frames=ddp_backward()), rank(1, frames=sleeping()), progress=STALLED),
     "deadlock", (1,)),
    ("async all_reduce: only native frames show the wait",
     job(rank(0, frames=async_wait_native()), rank(1, frames=sleeping()), progress=STALLED),
     "deadlock", (1,)),
    ("NCCL spin: 100% CPU but parked in a different collective",
     job(rank(0, cpu=100, frames=collective("all_reduce", 50), active=True),
         rank(1, cpu=100, frames=collective("all_gather_object", 88, "gather_stats"), active=True), progress=STALLED),
     "deadlock", (1,)),
    ("no step log at all: parked at 0% CPU for 20 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 20),
         rank(1, frames=sleeping(), idle_since=NOW - 20)),
     "deadlock", (1,)),
    ("no step log at all: parked only 4 s (a normal wait)",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 4),
         rank(1, frames=sleeping(), idle_since=NOW - 4)),
     "healthy", ()),
    ("no step log at all: both parked in collectives for 20 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 20),
         rank(1, frames=collective("barrier", 80), idle_since=NOW - 20)),
     "deadlock", (1,)),
    ("no step log at all: rank 1 spins in a loop of its own while rank 0 waits 12 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 12),
         rank(1, cpu=100, frames=computing(), active=True, state="R")),
     "straggler", (1,)),
    ("one sighting of step 40 (no pace yet), then rank 1 spins while rank 0 waits 12 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 12, step=40),
         rank(1, cpu=100, frames=computing(), active=True, state="R", step=40), progress=(NOW - 13,)),
     "straggler", (1,)),
    ("no step log at all: rank 1 busy while rank 0 waits only 4 s (a normal wait)",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 4),
         rank(1, cpu=100, frames=computing(), active=True, state="R")),
     "healthy", ()),
    ("no step log, ranks at work 60 s without a pause: rank 1 spins while rank 0 waits 5 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 5),
         rank(1, cpu=100, frames=computing(), active=True, state="R"), working_since=NOW - 65),
     "straggler", (1,)),
    ("one sighting of step 40 (no pace), ranks at work 60 s without a pause: rank 1 spins, rank 0 waits 5 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 5, step=40),
         rank(1, cpu=100, frames=computing(), active=True, state="R", step=40), progress=(NOW - 5.5,),
         working_since=NOW - 65),
     "straggler", (1,)),
    ("no step log, ranks at work 60 s without a pause: both parked 5 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 5),
         rank(1, frames=sleeping(), idle_since=NOW - 5), working_since=NOW - 65),
     "deadlock", (1,)),
    ("no step log, ranks at work 60 s without a pause: rank 0 waits 3 s (a normal wait)",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 3),
         rank(1, cpu=100, frames=computing(), active=True, state="R"), working_since=NOW - 63),
     "healthy", ()),
    ("no step log, its ranks came back from 2.5 s pauses before: rank 0 waits 5 s",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 5),
         rank(1, cpu=100, frames=computing(), active=True, state="R"), working_since=NOW - 65,
         longest_pause_s=2.5),
     "healthy", ()),
    ("no step log, at work only 2 s before rank 0 parked: its rhythm unknown, 5 s is a normal wait",
     job(rank(0, frames=collective("all_reduce", 50), idle_since=NOW - 5),
         rank(1, cpu=100, frames=computing(), active=True, state="R"), working_since=NOW - 7),
     "healthy", ()),
    ("no step log at all: rank 0 evaluates (its stack says so) while rank 1 waits 30 s",
     job(rank(0, cpu=100, frames=evaluating(), active=True, state="R"),
         rank(1, frames=collective("barrier", 80), idle_since=NOW - 30)),
     "healthy", ()),
    ("no step log at all: rank 0 has been saving for 150 s while rank 1 waits: past the phase's grace",
     job(rank(0, cpu=100, frames=saving_checkpoint(), active=True, state="R"),
         rank(1, frames=collective("barrier", 80), idle_since=NOW - 150)),
     "straggler", (0,)),
    ("straggler: rank 1 computes while rank 0 waits",
     job(rank(0, frames=collective("all_reduce", 50)), rank(1, cpu=100, frames=computing(), active=True),
         progress=STALLED),
     "straggler", (1,)),
    ("slow compute: everyone busy, no one waits",
     job(rank(0, cpu=100, frames=computing(), active=True), rank(1, cpu=99, frames=computing(), active=True),
         progress=STALLED),
     "slow_compute", ()),
    ("a stale stack from before the stall is not read as the current position",
     job(rank(0, frames=collective("all_reduce", 50)),
         rank(1, cpu=100, frames=collective("all_reduce", 50), stack_at=NOW - 30),
         progress=steps(NOW - 20, 0.1)),
     "straggler", (1,)),
    ("rank 1 exited 0 early; rank 0 failed with Connection closed by peer",
     job(rank(0, alive=False, exit=ExitView(NOW - 5, 1, None, PEER_CLOSED)),
         rank(1, alive=False, exit=ExitView(NOW - 5.01, 0, None, None)), progress=STALLED),
     "rank_exited", (1,)),
    ("rank 1 SIGKILLed; torchrun terminated rank 0",
     job(rank(0, alive=False, exit=ExitView(NOW - 4.9, None, signal.SIGTERM, None)),
         rank(1, alive=False, exit=ExitView(NOW - 5, None, signal.SIGKILL, None)), progress=STALLED),
     "rank_exited", (1,)),
    ("rank 1 SIGKILLed; torchrun's poll terminated rank 0 30 ms later",
     job(rank(0, alive=False, exit=ExitView(NOW - 4.97, None, signal.SIGTERM, None)),
         rank(1, alive=False, exit=ExitView(NOW - 5, None, signal.SIGKILL, None)), progress=STALLED),
     "rank_exited", (1,)),
    ("the peer's error was recorded a moment before the killed rank's exit",
     job(rank(0, alive=False, exit=ExitView(NOW - 5.02, 1, None, PEER_CLOSED)),
         rank(1, alive=False, exit=ExitView(NOW - 5, None, signal.SIGKILL, None)), progress=STALLED),
     "rank_exited", (1,)),
    ("rank 1 SIGKILLed; rank 0 ended 0.1 s later, its error not read yet",
     job(rank(0, alive=False, exit=ExitView(NOW - 4.9, 1, None, None)),
         rank(1, alive=False, exit=ExitView(NOW - 5, None, signal.SIGKILL, None)), progress=STALLED),
     "rank_exited", (1,)),
    ("two ranks ran out of data at the same moment",
     job(rank(0, alive=False, exit=ExitView(NOW - 4, 1, None, PEER_CLOSED)),
         rank(1, alive=False, exit=ExitView(NOW - 5, 0)), rank(2, alive=False, exit=ExitView(NOW - 4.99, 0)),
         progress=STALLED),
     "rank_exited", (1, 2)),
    ("rank 1 exited 0; rank 0 still alive, parked and stalled",
     job(rank(0, frames=collective("all_reduce", 50)), rank(1, alive=False, exit=ExitView(NOW - 11, 0)),
         progress=STALLED),
     "rank_exited", (1,)),
    ("rank 1 finished a moment before rank 0: still healthy",
     job(rank(0, cpu=100, frames=computing(), active=True), rank(1, alive=False, exit=ExitView(NOW - 0.3, 0)),
         progress=RUNNING),
     "healthy", ()),
    ("every rank ended with code 0",
     job(rank(0, alive=False, exit=ExitView(NOW - 1, 0)), rank(1, alive=False, exit=ExitView(NOW - 1.2, 0)),
         progress=STALLED),
     "finished", ()),
    ("rank 1 SIGSTOPped for 5 s",
     job(rank(0, frames=collective("all_reduce", 50)), rank(1, state="T", state_since=NOW - 5), progress=STALLED),
     "rank_stopped", (1,)),
    ("a stop seen once (py-spy's own pause) is not a stopped rank",
     job(rank(0, cpu=90), rank(1, cpu=90, state="t", state_since=NOW), progress=RUNNING),
     "healthy", ()),
    ("world size 3 never reached",
     job(rank(0, frames=init_pg(), first_seen=NOW - 20), rank(1, frames=init_pg(), first_seen=NOW - 20),
         world_size=3),
     "rendezvous_hang", (2,)),
    ("initialising for 3 s is normal",
     job(rank(0, frames=init_pg(), first_seen=NOW - 3), rank(1, frames=init_pg(), first_seen=NOW - 3), world_size=3),
     "healthy", ()),
    ("bytes still moving in the collective: slow network, not a deadlock",
     job(rank(0, frames=collective("all_reduce", 50), bytes_per_s=8e6), rank(1, frames=collective("all_reduce", 50)),
         progress=STALLED),
     "slow_network", ()),
    ("no stacks at all (py-spy missing): stalled, never a guessed deadlock",
     job(rank(0), rank(1), progress=STALLED, stacks_unavailable_reason="py-spy not found"),
     "stalled", ()),
]


def case(prefix: str) -> JobView:
    return next(c[1] for c in CASES if c[0].startswith(prefix))


@pytest.mark.parametrize(("situation", "job_view", "verdict", "culprits"), CASES, ids=[c[0] for c in CASES])
def test_verdict(situation: str, job_view: JobView, verdict: str, culprits: tuple[int, ...]) -> None:
    result = diagnose(job_view)
    assert (result.verdict, result.culprit_ranks) == (verdict, culprits), result.summary
    assert result.verdict in VERDICTS
    assert result.summary


def test_deadlock_groups_ranks_by_wait_site() -> None:
    result = diagnose(case("three ranks"))
    assert {(g.site, g.ranks) for g in result.groups} == {
        ("broadcast@train.py:85", (0, 1)),
        ("all_reduce@train.py:50", (2,)),
    }
    assert any("broadcast" in line for line in result.evidence)


def test_every_rank_gets_a_state_and_top_frame() -> None:
    result = diagnose(case("rank 1 left the loop"))
    by_rank = {r.rank: r for r in result.ranks}
    assert by_rank[0].state == "in_collective"
    assert by_rank[0].wait_site == "all_reduce@train.py:50"
    assert by_rank[0].top_frame.startswith("all_reduce (torch/distributed/distributed_c10d.py")
    assert by_rank[1].state == "idle"


def test_exit_evidence_names_the_signal() -> None:
    result = diagnose(case("rank 1 SIGKILLed"))
    assert any("killed by SIGKILL" in line for line in result.evidence)
    assert result.since == NOW - 5


def test_stall_since_is_the_last_progress() -> None:
    result = diagnose(case("rank 1 left the loop"))
    assert result.since == pytest.approx(NOW - 12)
    assert result.hints


def test_the_evidence_says_when_the_pace_comes_from_a_learned_line_format() -> None:
    learned = "learned (counter, 5 lines agree): T - mmengine - INFO - Iter(train) [  #/#]  loss: #.#"
    view = job(rank(0, frames=collective("all_reduce", 50), progress_pattern=learned),
               rank(1, frames=sleeping()), progress=STALLED)
    found = diagnose(view)
    assert found.verdict == "deadlock"
    assert ("steps read from a learned line format (counter, 5 lines agree): T - mmengine - INFO - "
            "Iter(train) [  #/#]  loss: #.#") in found.evidence
    plain = diagnose(job(rank(0, frames=collective("all_reduce", 50), progress_pattern="nanochat"),
                         rank(1, frames=sleeping()), progress=STALLED))
    assert not any("learned" in line for line in plain.evidence)


def test_the_evidence_says_when_the_pace_comes_from_a_heartbeat() -> None:
    learned = "learned (heartbeat, 6 lines agree): {'loss': #.#, 'grad_norm': #.#, 'epoch': #.#}"
    found = diagnose(job(rank(0, frames=collective("all_reduce", 50), progress_pattern=learned),
                         rank(1, frames=sleeping()), progress=STALLED))
    assert found.verdict == "deadlock"
    assert ("progress read from a line that recurs at a steady pace without a step number (steps are counted "
            "in its lines) (heartbeat, 6 lines agree): {'loss': #.#, 'grad_norm': #.#, 'epoch': #.#}") in found.evidence


@pytest.mark.parametrize(
    ("working_since", "longest_pause", "parked_since", "allowance"),
    [
        (None, 0.0, NOW, None),             # never seen at work: no rhythm
        (NOW - 2, 0.0, NOW, None),          # at work 2 s before parking: too short to know
        (NOW - 3, 0.0, NOW, 4.0),           # 3 s (a logged job's first three steps): known
        (NOW - 60, 0.0, NOW, 4.0),          # fast steps, never a pause: the floor
        (NOW - 60, 2.0, NOW, 6.0),          # pauses of 2 s came and went: three times that
        (NOW - 60, 5.0, NOW, PARKED_WITHOUT_PROGRESS_S),  # long pauses: never more than without a rhythm
    ],
)
def test_the_rhythm_of_a_job_without_step_logs(working_since, longest_pause, parked_since, allowance) -> None:
    from monitor.diagnosis.verdict import rhythm_allowance_s

    assert rhythm_allowance_s(working_since, longest_pause, parked_since) == allowance
