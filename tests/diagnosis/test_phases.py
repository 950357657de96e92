"""Phases that pause steps: read from stacks (table), and learned per phase by the cadence."""

from __future__ import annotations

import pytest

from monitor.diagnosis import LogPhase, diagnose
from monitor.diagnosis.cadence import job_cadence
from monitor.diagnosis.phases import phase_of
from tests.diagnosis.builders import NOW, collective, computing, job, py, rank, stack, steps

SITE = "/venv/lib/python3.11/site-packages/"


def lib(name: str, path: str) -> object:
    return py(name, SITE + path, 1)


@pytest.mark.parametrize(
    ("frames", "phase"),
    [
        ((py("forward"), py("evaluate"), py("main")), "evaluation"),
        ((py("forward"), py("run_validation", "/work/job/loops.py")), "evaluation"),
        ((lib("_save", "torch/serialization.py"), lib("save", "torch/serialization.py"), py("main")), "checkpoint"),
        ((lib("write_data", "torch/distributed/checkpoint/filesystem.py"), py("main")), "checkpoint"),
        ((py("save_checkpoint"), py("main")), "checkpoint"),
        ((lib("compile_fx", "torch/_inductor/compile_fx.py"), lib("_fn", "torch/_dynamo/eval_frame.py"), py("main")),
         "compilation"),
        ((lib("run", "triton/compiler/compiler.py"), py("main")), "compilation"),
        # Hugging Face Trainer and Lightning call the user's code from their own loops.
        ((lib("forward", "transformers/models/gpt2/modeling_gpt2.py"), lib("evaluation_loop", "transformers/trainer.py"),
          lib("evaluate", "transformers/trainer.py"), py("main")), "evaluation"),
        ((lib("_save_checkpoint", "transformers/trainer.py"), py("main")), "checkpoint"),
        ((lib("run", "lightning/pytorch/loops/evaluation_loop.py"), py("main")), "evaluation"),
        # A compiled model's every step runs through eval_frame.py and the AOT runtime
        # wrappers; torch's own inference_mode and _validate_* helpers are no phase either.
        ((lib("_fn", "torch/_dynamo/eval_frame.py"), lib("runtime_wrapper",
          "torch/_functorch/_aot_autograd/runtime_wrappers.py"), py("train_step"), py("main")), None),
        ((lib("__enter__", "torch/autograd/grad_mode.py"), lib("inference_mode", "torch/autograd/grad_mode.py"),
          py("train_step")), None),
        ((lib("_validate_output_list_for_rank", "torch/distributed/distributed_c10d.py"), py("train_step")), None),
        # torch built from source (no site-packages in the path) is still library code
        ((py("_fn", "/opt/pytorch/torch/_dynamo/eval_frame.py"), py("train_step"), py("main")), None),
        ((py("compile_fx", "/opt/pytorch/torch/_inductor/compile_fx.py"), py("main")), "compilation"),
        (computing(), None),
        (collective("all_reduce", 50), None),
    ],
)
def test_phase_of_stack(frames, phase) -> None:
    assert phase_of(stack(frames)) == phase


def eval_every(passes: int, eval_s: float, then: float) -> tuple[tuple[float, ...], tuple[tuple[float, str], ...]]:
    """1 s steps, with ``passes`` evaluations of ``eval_s`` seconds between them (each marked
    once by a log line); the last step was ``then`` seconds before NOW."""
    times: list[float] = []
    marks: list[tuple[float, str]] = []
    t = NOW - then - passes * (eval_s + 10)
    for _ in range(passes):
        times += [t + i for i in range(10)]
        t += 9
        marks.append((t + 1, "evaluation"))
        t += eval_s
    times += [t, t + 1]
    return tuple(x for x in times if x <= NOW - then), tuple(marks)


def test_evaluation_gaps_set_the_evaluation_pace_not_the_step_pace() -> None:
    progress, marks = eval_every(passes=2, eval_s=30, then=0)
    cadence = job_cadence(job(rank(0), rank(1), progress=progress, phase_marks=marks))
    assert cadence.median_interval_s == 1.0 and cadence.longest_interval_s == 1.0
    assert cadence.stall_after_s == 5.0
    assert cadence.phase_longest("evaluation") == 30.0
    # without the marks the evaluations stretch the step threshold to 1.5 x 30 s
    assert job_cadence(job(rank(0), rank(1), progress=progress)).stall_after_s == 45.0


def test_a_deadlock_after_evaluations_is_caught_at_the_step_pace() -> None:
    progress, marks = eval_every(passes=2, eval_s=30, then=0)
    stalled = tuple(t - 10 for t in progress)  # the same history, 10 s of silence since
    marks = tuple((t - 10, p) for t, p in marks)
    view = job(rank(0, frames=collective("all_reduce", 50)), rank(1, frames=collective("barrier", 80)),
               progress=stalled, phase_marks=marks)
    result = diagnose(view)
    assert (result.verdict, result.culprit_ranks) == ("deadlock", (1,)), result.summary


LONG_EVAL = LogPhase("evaluation", NOW - 150, "***** Running Evaluation *****")


def test_a_long_evaluation_seen_before_may_take_twice_as_long_again() -> None:
    """Earlier evaluations took 200 s: one 160 s in is healthy, past its first-time grace."""
    progress, marks = eval_every(passes=1, eval_s=200, then=160)
    busy = [rank(r, cpu=90, frames=computing(), active=True, log_phase=LONG_EVAL) for r in (0, 1)]
    result = diagnose(job(*busy, progress=progress, phase_marks=marks + ((NOW - 150, "evaluation"),)))
    assert result.verdict == "healthy", result.summary
    assert "evaluation phase" in result.summary
    assert any("took up to 200s" in h and "after 400s" in h for h in result.hints), result.hints


def test_a_first_long_evaluation_outlasting_its_grace_is_slow_compute() -> None:
    busy = [rank(r, cpu=90, frames=computing(), active=True, log_phase=LONG_EVAL) for r in (0, 1)]
    result = diagnose(job(*busy, progress=steps(NOW - 160, 1.0), phase_marks=((NOW - 150, "evaluation"),)))
    assert result.verdict == "slow_compute", result.summary


def test_a_phase_line_read_with_the_step_before_it_marks_that_gap() -> None:
    """The agent reads "step 9" and "Running Evaluation" in one poll: the mark shares the step's time."""
    progress = steps(NOW - 40, 1.0, count=10) + steps(NOW, 1.0, count=10)  # a 31 s gap after NOW - 40
    cadence = job_cadence(job(rank(0), progress=progress, phase_marks=((NOW - 40, "evaluation"),)))
    assert cadence.phase_longest("evaluation") == 31.0 and cadence.longest_interval_s == 1.0


def test_a_log_phase_read_with_the_last_step_counts() -> None:
    same_poll = LogPhase("evaluation", NOW - 20, "***** Running Evaluation *****")
    busy = [rank(r, cpu=90, frames=computing(), active=True, log_phase=same_poll) for r in (0, 1)]
    result = diagnose(job(*busy, progress=steps(NOW - 20, 1.0)))
    assert result.verdict == "healthy" and "evaluation phase" in result.summary, result.summary
