"""Log line parsers (table tests) and the follower on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.discovery import RankIdentity, RankProcess
from agent.exits import launcher_status
from agent.logpatterns import (
    LauncherBlockParser,
    LauncherFailure,
    Progress,
    TracebackTracker,
    compile_user_pattern,
    match_phase,
    match_progress,
    split_prefixes,
)
from agent.logs import FIRST_READ_BYTES, FileTailer, LogFollower

FIXTURES = Path(__file__).parent.parent / "fixtures" / "agent"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("step 00004/05000 (0.08%) | loss: 10.412 | lrm: 1.00 | dt: 512.3ms", Progress(4, 5000, "nanochat")),
        ("step 00004/05000 | loss: 10.4", Progress(4, 5000, "nanochat")),
        (" iteration      100/    1000 | consumed samples:        12800 | elapsed time per iteration (ms): 812.3",
         Progress(100, 1000, "megatron")),
        ("\x1b[31mstep: 10  \x1b[32mloss:  7.9321  \x1b[33mmemory: 12.3GiB", Progress(10, None, "torchtitan")),
        ("step: 10  loss:  7.9321  memory: 12.3GiB", Progress(10, None, "torchtitan")),
        (" 45%|████▌     | 45/100 [00:05<00:06,  8.50it/s]", Progress(45, 100, "tqdm")),
        ("Epoch 0:  45%|████▌     | 45/100 [00:05<00:06,  8.50it/s, v_num=0, train_loss=1.23]",
         Progress(45, 100, "tqdm")),
        ("  0%|          | 0/500 [00:00<?, ?it/s]", Progress(0, 500, "tqdm")),
        ("  2%|▏         | 10/500 [1:02:03<3:02:01,  1.1s/it]", Progress(10, 500, "tqdm")),
        ("step 12", Progress(12, None, "generic")),
        ("train step=12 loss=0.1", Progress(12, None, "generic")),
        ("Step: 7, loss 3.2", Progress(7, None, "generic")),
        ("global_step=99", Progress(99, None, "generic")),
        ("loading checkpoint shards", None),
        ("timestep 5 of the diffusion", None),
        ("3 steps remaining", None),
        ("{'loss': 1.23, 'learning_rate': 5e-05, 'epoch': 0.5}", None),
    ],
)
def test_match_progress(line, expected):
    assert match_progress(line) == expected


@pytest.mark.parametrize(
    "line, phase",
    [
        ("***** Running Evaluation *****", "evaluation"),  # Hugging Face Trainer
        ("[rank0]: eval step 30 batch 3 | val loss 2.3012", "evaluation"),
        (" validation loss at iteration 100 | lm loss value: 2.1E+00 |", "evaluation"),  # Megatron
        ("Step 00250 | Validation bpb: 3.2104", "evaluation"),  # nanochat
        ("Validation DataLoader 0:  40%|████      | 4/10 [00:01<00:01]", "evaluation"),  # Lightning
        ("{'eval_loss': 2.31, 'eval_runtime': 10.2}", "evaluation"),
        ("Saving model checkpoint to out/checkpoint-500", "checkpoint"),  # Hugging Face Trainer
        ("saving checkpoint at iteration     100 to /ckpt", "checkpoint"),  # Megatron
        ("Saving the checkpoint (or staging if async is enabled).", "checkpoint"),  # torchtitan
        ("\x1b[32mWriting state dict to /ckpt/step-10\x1b[0m", "checkpoint"),
        ("Compiling the model... (takes a ~minute)", "compilation"),
        ("Recompiling function forward in /work/model.py:40", "compilation"),
        # named but not entered: skipped phases, tracebacks, torch._dynamo giving up on compiling
        ("Skipping evaluation: no eval dataset", None),
        ("checkpointing disabled for this run", None),
        ('  File "/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 632, in _fn', None),
        ("W1122 torch._dynamo hit config.recompile_limit (8)", None),
        # step lines, and words that merely contain the letters, announce nothing
        ("step 00004/05000 (0.08%) | loss: 10.4 | lrm: 1.00 | dt: 512.3ms", None),
        ("step 3 | loss 2.0 | dtype=bf16 | interval 3", None),
        ("medieval retrieval of saved weights", None),
        ("checkpoint saved (40 writes to /tmp/ckpt.pt)", None),  # the phase is over
        ("", None),
    ],
)
def test_match_phase(line, phase):
    assert match_phase(line) == phase


def test_user_pattern_named_or_first_group():
    named = compile_user_pattern(r"it=(?P<step>\d+)")
    assert match_progress("foo it=17 bar", named) == Progress(17, None, "user")
    first = compile_user_pattern(r"batch #(\d+)")
    assert match_progress("batch #5 done", first) == Progress(5, None, "user")
    # builtins still apply when the user's pattern does not match
    assert match_progress("step 3", first) == Progress(3, None, "generic")
    with pytest.raises(ValueError):
        compile_user_pattern(r"step \d+")


@pytest.mark.parametrize(
    "line, rank, local_rank, text",
    [
        ("[rank1]: Traceback (most recent call last):", 1, None, "Traceback (most recent call last):"),
        ("[default3]:step 5", None, 3, "step 5"),
        ("[default0]:[rank4]:   File \"t.py\", line 1", 4, 0, "  File \"t.py\", line 1"),
        ("plain line", None, None, "plain line"),
        ("[rankX]: not a prefix", None, None, "[rankX]: not a prefix"),
    ],
)
def test_split_prefixes(line, rank, local_rank, text):
    p = split_prefixes(line)
    assert (p.rank, p.local_rank, p.text) == (rank, local_rank, text)


def test_traceback_last_line_including_chained():
    lines = [
        "hello",
        "Traceback (most recent call last):",
        '  File "t.py", line 3, in <module>',
        "    f()",
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "t.py", line 5, in <module>',
        "    raise ValueError('bad batch')",
        "ValueError: bad batch",
        "RuntimeError: not after a traceback",
    ]
    tracker = TracebackTracker()
    assert [e for e in map(tracker.feed, lines) if e] == ["KeyError: 'x'", "ValueError: bad batch"]


def test_launcher_block_from_real_torchrun_logs():
    def failures(name):
        parser = LauncherBlockParser()
        return [f for f in map(parser.feed, (FIXTURES / name).read_text().splitlines()) if f]

    sigkill = failures("torchrun_rank1_sigkill.log")
    assert LauncherFailure(pid=3108, exitcode=-9, rank=1, local_rank=1) in sigkill
    assert LauncherFailure(pid=3107, exitcode=-15, rank=0, local_rank=0) in sigkill
    assert LauncherFailure(pid=3108, exitcode=-9, rank=None, local_rank=1) in sigkill  # the E... line
    exit3 = failures("torchrun_two_nodes_node1_exit3.log")
    assert LauncherFailure(pid=3081, exitcode=3, rank=1, local_rank=0) in exit3
    assert launcher_status(-9) == (None, 9) and launcher_status(3) == (3, None)


def _rank(pid, rank, local_rank, job="j"):
    return RankProcess(pid, 1, 1, RankIdentity(job, rank, 2, local_rank, "torchrun"), "python t.py")


class SharedLog:
    """A --log file followed for ranks 0 and 1 (pids 101, 102), read once at ``now`` 1.0."""

    def __init__(self, tmp_path, backlog: str = "") -> None:
        self.path = tmp_path / "train.log"
        self.path.write_text(backlog)
        self.ranks = [_rank(101, 0, 0), _rank(102, 1, 1)]
        self.follower = LogFollower(extra_paths=(str(self.path),))
        self.follower.collect(self.ranks, now=1.0)

    def append(self, text: str, now: float) -> None:
        with open(self.path, "a") as f:
            f.write(text)
        self.follower.collect(self.ranks, now=now)


def test_follower_on_real_torchrun_log_attributes_by_prefix(tmp_path):
    """A launcher log (--log): [defaultN] is the local rank, [rankN] the global rank."""
    log = tmp_path / "train.log"
    log.write_text("")
    ranks = [_rank(101, 0, 0), _rank(102, 1, 1)]
    follower = LogFollower(extra_paths=(str(log),))
    follower.collect(ranks, now=1.0)
    log.write_text((FIXTURES / "torchrun_rank0_valueerror.log").read_text())
    follower.collect(ranks, now=2.0)
    assert follower.errors_of(101) == ["ValueError: bad batch shape (3, 4)"]
    assert follower.errors_of(102)[0].startswith("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo")
    # the launcher's own unprefixed ChildFailedError traceback belongs to no rank
    assert not any("ChildFailedError" in e for e in follower.errors_of(101) + follower.errors_of(102))
    follower.close()


def test_follower_progress_prefixed_and_shared(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    ranks = [_rank(101, 0, 0), _rank(102, 1, 1)]
    follower = LogFollower(extra_paths=(str(log),))
    follower.collect(ranks, now=1.0)
    with open(log, "a") as f:
        f.write("[default0]:step 1/10 | loss: 1.0\n[default1]:step 1/10 | loss: 1.0\n[default0]:step 2/10 | x\n")
    follower.collect(ranks, now=2.0)
    p0, p1 = follower.progress_of(101), follower.progress_of(102)
    assert (p0["step"], p0["events"], p0["scope"], p0["total_steps"]) == (2, 2, "rank", 10)
    assert (p1["step"], p1["events"]) == (1, 1)
    assert p0["recent"] == [(2.0, 1), (2.0, 2)]
    # unprefixed progress in a --log file is the job's
    follower2 = LogFollower(extra_paths=(str(log),))
    log.write_text("")
    follower2.collect(ranks, now=1.0)
    with open(log, "a") as f:
        f.write("step 7\n")
    follower2.collect(ranks, now=3.0)
    assert follower2.progress_of(101)["scope"] == "job" == follower2.progress_of(102)["scope"]
    assert follower2.progress_of(102)["step"] == 7
    follower.close()
    follower2.close()


def test_tailer_first_sight_tail_partial_lines_truncation(tmp_path):
    path = tmp_path / "big.log"
    path.write_bytes(b"x" * (FIRST_READ_BYTES + 100) + b"\nstep 1\nstep 2\npart")
    tailer = FileTailer(str(path), str(path))
    assert tailer.read_lines() == ["step 1", "step 2"]  # the cut first line is skipped
    with open(path, "ab") as f:
        f.write(b"ial\n\r 3/9 [00:01<00:02, 1it/s]\r 4/9 [00:02<")
    assert tailer.read_lines() == ["partial", " 3/9 [00:01<00:02, 1it/s]"]
    path.write_bytes(b"step 1\n")  # truncated and rewritten
    assert tailer.read_lines() == ["step 1"]
    tailer.close()


def test_bar_reset_still_counts_as_progress(tmp_path):
    path = tmp_path / "bar.log"
    path.write_text("")
    follower = LogFollower(extra_paths=(str(path),))
    ranks = [_rank(1, 0, 0)]
    follower.collect(ranks, now=0.0)
    with open(path, "a") as f:
        f.write("\r 9/10 [00:01<00:00]\r 10/10 [00:01<00:00]\r 10/10 [00:01<00:00]\n")
    follower.collect(ranks, now=1.0)
    with open(path, "a") as f:
        f.write("\r 1/10 [00:00<00:02]\n")
    follower.collect(ranks, now=2.0)
    p = follower.progress_of(1)
    assert p["events"] == 3 and p["step"] == 1  # a re-drawn 10/10 is not an event
    follower.close()


def test_rotation_of_a_log_path(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("step 1\n")
    follower = LogFollower(extra_paths=(str(path),))
    ranks = [_rank(1, 0, 0)]
    follower.collect(ranks, now=0.0)
    os.rename(path, tmp_path / "train.log.1")
    path.write_text("step 2\n")  # a new file: read from its start
    follower.collect(ranks, now=1.0)
    assert follower.progress_of(1)["step"] == 2
    follower.close()



def test_job_progress_after_a_ranks_own_lines_is_not_hidden(tmp_path):
    """A rank's prefixed eval lines, then the job's shared step lines: the newer progress is reported."""
    log = SharedLog(tmp_path)
    log.append("[rank0]: eval step 40 batch 10 | val loss 0.3\n", now=2.0)
    assert log.follower.progress_of(101)["scope"] == "rank"
    log.append("step 41/1000 | loss 0.1\n", now=3.0)
    progress = log.follower.progress_of(101)
    assert (progress["scope"], progress["step"], progress["step_at"]) == ("job", 41, 3.0)
    log.follower.close()


def test_phase_lines_are_kept_per_rank_but_not_from_history(tmp_path):
    """Only lines read live count (a backlog says nothing about now); the newest one is kept."""
    log = SharedLog(tmp_path, backlog="Saving model checkpoint to old/\n")
    follower = log.follower
    assert follower.phase_of(101) is None
    log.append("step 40/1000 | loss 0.2\n[rank1]: eval step 40 batch 1 | val loss 0.3\n", now=2.0)
    assert follower.phase_of(101) is None
    assert follower.phase_of(102) == {"phase": "evaluation", "seen_at": 2.0,
                                      "line": "eval step 40 batch 1 | val loss 0.3"}
    log.append("Saving model checkpoint to out/checkpoint-40\n", now=3.0)  # unprefixed in a --log: the job's
    assert follower.phase_of(101)["phase"] == follower.phase_of(102)["phase"] == "checkpoint"
    assert follower.phase_of(102)["seen_at"] == 3.0
    follower.close()


def test_a_new_step_ends_the_phase_even_when_read_in_the_same_poll(tmp_path):
    """Line order decides: a step then "Running Evaluation" (one read) is a phase; the reverse is not."""
    log = SharedLog(tmp_path)
    follower = log.follower
    log.append("step 10/100 | loss 2.0\n***** Running Evaluation *****\n", now=2.0)
    assert follower.phase_of(101)["seen_at"] == follower.progress_of(101)["step_at"] == 2.0
    log.append("eval step 10 batch 1 | val loss 2.1\n", now=3.0)  # the same step again: still evaluating
    assert follower.phase_of(101)["line"] == "eval step 10 batch 1 | val loss 2.1"
    log.append("Saving model checkpoint to out/\nstep 11/100 | loss 1.9 | val_loss 2.1\n", now=4.0)
    assert follower.phase_of(101) is None
    follower.close()


def test_follower_learns_the_step_of_a_format_no_pattern_knows(tmp_path):
    """mmengine's "Iter(train) [  120/40000]": no built-in pattern reads it; the learner does,
    from the third line read over time, per rank prefix, and says what it learned."""
    log = SharedLog(tmp_path)
    for i in range(4):
        step = 120 + 10 * i
        log.append(f"[default0]:Iter(train) [  {step}/40000]  lr: 1.0000e-02  eta: 1 day, 2:03:0{i}  "
                   f"time: 0.{5 + i}  memory: 3215  loss: {2.5 - i / 10:.4f}\n", now=2.0 + i)
        got = log.follower.progress_of(101)
        if i < 2:
            assert got is None  # two lines cannot show a steady counter yet
    got = log.follower.progress_of(101)
    assert (got["step"], got["total_steps"], got["scope"]) == (150, 40000, "rank")
    assert got["pattern"].startswith("learned (counter, 4 lines agree): ")
    assert "Iter(train) [ #/#]" in got["pattern"]
    # The steps read before the counter was learned count too, at the times they were read: the
    # pace is known as soon as for a format a built-in pattern reads.
    assert [tuple(point) for point in got["recent"]] == [(2.0, 120), (3.0, 130), (4.0, 140), (5.0, 150)]
    assert log.follower.progress_of(102) is None  # rank 1 printed nothing
    log.follower.close()


def test_a_step_regex_turns_the_learner_off(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("")
    ranks = [_rank(101, 0, 0)]
    follower = LogFollower(extra_paths=(str(path),), user_pattern=compile_user_pattern(r"it=(\d+)"))
    follower.collect(ranks, now=1.0)
    for i in range(5):
        with open(path, "a") as f:
            f.write(f"Iter(train) [  {120 + i}/40000]  loss: 0.5\n")
        follower.collect(ranks, now=2.0 + i)
    assert follower.progress_of(101) is None
    follower.close()
