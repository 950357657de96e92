"""The progress learner (agent/progress_learner.py) on a corpus of real progress-line shapes.

Each shape is written the way its framework prints it (the source is named: the file that
formats the line, or the documentation that shows it). Lines are fed one per read of the log,
as the agent does once a second; the learner must name the step (and the total where the line
shows one) within 5 lines. Lines with numbers that are not progress must never be taken.
"""

from __future__ import annotations

import random

import pytest

from agent.progress_learner import ProgressLearner, masked

# (name, where the shape comes from, format, first step, stride, total or None)
CORPUS: list[tuple[str, str, str, int, int, int | None]] = [
    ("mmengine", "mmengine/runner/log_processor.py (Iter(train) [...])",
     "{date} - mmengine - INFO - Iter(train) [{step:>5}/40000]  lr: {lr:.4e}  eta: 1 day, 2:03:{sec:02d}  "
     "time: {t:.4f}  data_time: {dt:.4f}  memory: 3215  loss: {loss:.4f}", 120, 10, 40000),
    ("detectron2", "detectron2/utils/events.py CommonMetricPrinter",
     "[07/25 10:20:{sec:02d} d2.utils.events]:  eta: 0:12:{sec:02d}  iter: {step}  total_loss: {loss:.3f}  "
     "time: {t:.4f}  data_time: {dt:.4f}  lr: {lr:.6f}  max_mem: 1234M", 119, 20, None),
    ("fairseq", "fairseq/logging/progress_bar.py SimpleProgressBar",
     "{date} | INFO | train_inner | epoch 001:    {step} / 1000 loss={loss:.3f}, nll_loss={loss:.3f}, "
     "ppl=720.5, wps=12345, ups=3.2, wpb=3800, bsz=128, num_updates={step}, lr={lr:.3e}, gnorm=1.2, "
     "train_wall=30, gb_free=10.1, wall=40", 100, 100, 1000),
    ("pytorch imagenet example", "pytorch/examples imagenet/main.py ProgressMeter",
     "Epoch: [0][{step:>4}/5005]\tTime  {t:.3f} ( {t:.3f})\tData  {dt:.3f} ( {dt:.3f})\tLoss {loss:.4e} "
     "({loss:.4e})\tAcc@1   0.00 (  0.10)\tAcc@5   0.78 (  0.50)", 10, 10, 5005),
    ("timm", "pytorch-image-models train.py (Train: epoch [batch/total])",
     "Train: 0 [{step:>4}/1251 (  4%)]  Loss: {loss:.3f} ({loss:.2f})  Time: {t:.3f}s,  621.34/s  "
     "({t:.3f}s,  616.83/s)  LR: {lr:.3e}  Data: {dt:.3f} ({dt:.3f})", 50, 50, 1251),
    ("nanoGPT", "karpathy/nanoGPT train.py", "iter {step}: loss {loss:.4f}, time {t:.2f}ms, mfu 40.12%", 100, 10, None),
    ("llm.c", "karpathy/llm.c train_gpt2.py",
     "step {step:>4}/74 | train loss {loss:.6f} | norm 1.2345 | lr {lr:.2e} | ({t:.2f} ms | 123456 tok/s)", 10, 1, 74),
    ("mmdetection (mmcv 1.x)", "mmcv/runner/hooks/logger/text.py",
     "{date} - mmdet - INFO - Epoch [1][{step}/7330]\tlr: {lr:.3e}, eta: 1 day, 6:32:07, time: {t:.3f}, "
     "data_time: {dt:.3f}, memory: 3816, loss_rpn_cls: {loss:.4f}, loss: {loss:.4f}", 50, 50, 7330),
    ("composer", "mosaicml/composer loggers/console_logger.py",
     "[batch={step}/1000]: Train time/batch: {step_minus}  Train loss/train/total: {loss:.4f}", 10, 1, 1000),
    ("absl / T5X", "google-research/t5x (absl logging)",
     "I0101 12:00:{sec:02d}.123456 140000 train.py:123] [{step}] train/loss={loss:.4f}, train/lr={lr:.4f}",
     100, 100, None),
    ("espnet", "espnet2/train/reporter.py",
     "{date} (trainer:732) INFO: 1epoch:train:{step}-{step_end}batch: iter_time={lr:.3e}, "
     "forward_time={t:.3f}, loss={loss:.3f}", 101, 100, None),
    ("paddlenlp", "PaddleNLP examples (global step ... speed)",
     "global step {step}, epoch: 0, batch: {step_minus}, loss: {loss:.6f}, speed: 2.1 step/s", 100, 10, None),
    ("keras progbar", "keras/src/utils/progbar.py",
     "{step:>4}/938 [==>...........................] - ETA: 1:23 - loss: {loss:.4f} - accuracy: 0.8765", 100, 10, 938),
    ("opennmt-py", "OpenNMT-py onmt/utils/statistics.py",
     "[{date} INFO] Step {step}/100000; acc: 10.0; ppl: 1000.0; xent: {loss:.2f}; lr: {lr:.5f}; "
     "sents: 1234; bsz: 1234/1234/12; 12345/12345 tok/s; 30 sec", 100, 100, 100000),
    ("deepspeed", "deepspeed/runtime/engine.py (log_dist)",
     "[{date}] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped=0, lr=[{lr:.5f}], "
     "mom=[(0.9, 0.999)]", 10, 10, None),
    ("pytorch ddp tutorial", "pytorch/examples distributed/ddp-tutorial-series multigpu.py",
     "[GPU0] Epoch {step} | Batchsize: 32 | Steps: 64", 0, 1, None),
    ("torchtitan", "torchtitan/train.py",
     "[rank0]:[titan] {date} - root - INFO - step: {step:>2}  loss: {loss:7.4f}  memory: 30.1GiB(38.1%)  "
     "tps: 1,234  mfu: 40.1%", 10, 1, None),
    ("megatron", "Megatron-LM megatron/training/training.py training_log",
     " [{date}] iteration      {step}/    1000 | consumed samples:       {samples} | elapsed time per "
     "iteration (ms): {t:.1f} | learning rate: {lr:.3E} | global batch size:    32 | lm loss: {loss:.6E} |",
     100, 10, 1000),
    ("nanochat", "karpathy/nanochat scripts/base_train.py",
     "step {step:05d}/05000 (0.08%) | loss: {loss:.6f} | lrm: 1.00 | dt: {t:.2f}ms | tok/sec: 123,456 | "
     "mfu: 40.12 | total time: 0.05m", 4, 1, 5000),
    ("accelerate nlp example", "huggingface/accelerate examples/nlp_example.py",
     "epoch {step}: {{'accuracy': 0.8{sec:02d}, 'f1': 0.85}}", 0, 1, None),
    ("lightning print", "a LightningModule that prints in training_step",
     "Epoch 3, global step {step}: train_loss={loss:.3f}", 120, 1, None),
    ("custom ep/it", "a hand-written loop",
     "ep 3 it {step} loss {loss:.3f} lr {lr:.2e}", 120, 1, None),
    ("every 50 steps", "a hand-written loop that logs every 50 steps",
     "[train] {date} step={step} loss={loss:.4f} grad_norm={lr:.3f}", 50, 50, None),
    ("sentence-transformers style", "a print with the batch counter last",
     "Training loss {loss:.4f} | lr {lr:.2e} | batch {step}", 7, 1, None),
    ("fastai table row", "fastai/callback/progress.py (the metrics table)",
     "{step:<6} {loss:.6f}    {loss:.6f}    0.{sec:02d}0000    00:{sec:02d}", 0, 1, None),
    ("jax/flax print", "a flax training loop",
     "train step: {step}, loss: {loss:.4f}, accuracy: 91.{sec:02d}", 100, 100, None),
]


def render(fmt: str, step: int, stride: int, rng: random.Random, i: int) -> str:
    return fmt.format(step=step, step_minus=step - 1, step_end=step + stride - 1, samples=step * 32,
                      loss=rng.uniform(1, 9), lr=rng.uniform(1e-5, 1e-3), t=rng.uniform(100, 900),
                      dt=rng.uniform(0, 1), sec=(7 + 13 * i) % 60, date=f"2026-01-01 12:00:{(3 * i) % 60:02d}")


@pytest.mark.parametrize(("name", "source", "fmt", "first", "stride", "total"), CORPUS, ids=[c[0] for c in CORPUS])
def test_the_step_is_learned_within_five_lines(name: str, source: str, fmt: str, first: int, stride: int,
                                               total: int | None) -> None:
    rng = random.Random(name)
    learner = ProgressLearner()
    found = []
    for i in range(8):
        step = first + i * stride
        got = learner.feed(render(fmt, step, stride, rng, i), read_at=1000.0 + i)
        found.append((i, step, got))
    learned = [(i, step, got) for i, step, got in found if got is not None]
    assert learned, f"{name} ({source}): no step learned; template {masked(render(fmt, first, stride, rng, 0))[0]!r}"
    first_line = learned[0][0]
    assert first_line < 5, f"{name}: learned only at line {first_line + 1}"
    for _, step, got in learned:
        assert got.step == step, (name, got)
        assert got.total == total, (name, got)


def test_the_corpus_has_twenty_five_shapes_or_more() -> None:
    assert len(CORPUS) >= 25


NOT_PROGRESS: list[tuple[str, list[str]]] = [
    ("NCCL's channel list, printed at once", [
        f"node-a:1234:1301 [0] NCCL INFO Channel {c:02d}/32 :    0   1   2   3" for c in range(32)]),
    ("a per-class metrics table, printed at once", [f"class {c:3d}: precision 0.{c:02d}1 recall 0.5" for c in range(40)]),
    ("a traceback", ['  File "/work/train.py", line 97, in train_step', '  File "/work/train.py", line 141, in main',
                     '  File "/work/train.py", line 160, in <module>']),
    ("losses alone", ["loss 2.345", "loss 2.301", "loss 2.297", "loss 2.250", "loss 2.249"]),
    ("timestamps alone", [f"2026-01-01 12:00:{s:02d} heartbeat" for s in range(0, 50, 10)]),
    ("a gloo warning repeated", ["[W socket.cpp:464] [c10d] The server socket has failed to listen on [::]:29500"] * 5),
    ("memory and throughput that rise", [f"mem {1000 + 10 * i} MB, {2000 + 100 * i} tok/s" for i in range(6)]),
]


@pytest.mark.parametrize(("name", "lines"), NOT_PROGRESS, ids=[n for n, _ in NOT_PROGRESS])
def test_numbers_that_are_not_progress_are_never_taken(name: str, lines: list[str]) -> None:
    learner = ProgressLearner()
    # Printed at once, or one line a second where time passes: neither is taken.
    at_once = [learner.feed(line, read_at=1000.0) for line in lines]
    assert not any(at_once), name
    learner = ProgressLearner()
    spread = [learner.feed(line, read_at=1000.0 + i) for i, line in enumerate(lines)]
    if name.endswith("printed at once"):
        return  # spread over time, a numbered list is indistinguishable from progress
    # Losses printed at a steady pace are a heartbeat (below), never a step number.
    assert not any(s for s in spread if s and s.kind != "heartbeat"), (name, [s for s in spread if s])
    if name != "losses alone":
        assert not any(spread), (name, [s for s in spread if s])


HF_TRAINER = "{{'loss': {loss:.4f}, 'grad_norm': {norm:.3f}, 'learning_rate': 4.9{i}e-05, 'epoch': {epoch:.2f}}}"


def test_a_line_that_recurs_at_a_steady_pace_without_a_counter_is_a_heartbeat() -> None:
    # transformers' Trainer logs a dict of floats every logging_steps: no step number in it.
    learner = ProgressLearner()
    got = [learner.feed(HF_TRAINER.format(loss=2.5 - i / 50, norm=1 + i / 7, i=i, epoch=0.01 * (i + 1)),
                        read_at=1000.0 + 2 * i) for i in range(8)]
    beats = [g for g in got if g is not None]
    assert beats and got.index(beats[0]) == 2  # three reads at a steady pace
    assert all(b.kind == "heartbeat" and b.total is None for b in beats)
    assert [b.step for b in beats] == list(range(3, 9))  # beats counted, one per line
    assert beats[-1].template.startswith("{'loss': #.#")


def test_a_fast_heartbeat_printed_many_times_per_read_is_learned_from_its_reads() -> None:
    learner = ProgressLearner()
    got = []
    for read in range(6):
        for line in range(16):  # a 0.06 s step, logged each step, read once a second
            i = read * 16 + line
            got.append(learner.feed(HF_TRAINER.format(loss=2 - i / 100, norm=1 + i / 1000, i=i % 10, epoch=i / 1000),
                                    read_at=1000.0 + read))
    assert got[-1] is not None and got[-1].kind == "heartbeat" and got[-1].step == 96
    assert got[-1].confidence == 6
    # Learned as soon as a counter would be: in the second read, once it had three moving lines.
    assert next(i for i, g in enumerate(got) if g is not None) == 16 + 2


def test_a_fast_counter_is_never_taken_for_a_heartbeat() -> None:
    """mmengine at 16 lines a read: the last lines of a read share it, and show no counter alone."""
    learner = ProgressLearner()
    got = []
    for read in range(6):
        for line in range(16):
            step = 100 + read * 16 + line
            got.append(learner.feed(f"Iter(train) [{step:>6}/40000]  lr: 1.0000e-02  time: 0.{line:02d}  "
                                    f"loss: {2 - step / 1000:.4f}", read_at=1000.0 + read))
    learned = [g for g in got if g is not None]
    assert learned and all(g.kind == "counter" for g in learned), {g.kind for g in learned}
    assert [g.step for g in learned] == sorted(g.step for g in learned)


@pytest.mark.parametrize(
    ("name", "lines", "reads"),
    [
        ("a watchdog's wait, at a steady pace", [f"[W ProcessGroupNCCL.cpp:1234] waited {10.5 * i:.1f} s for work"
                                                 for i in range(8)], range(8)),
        ("an elastic heartbeat", [f"heartbeat sent at {1000.25 + i:.2f}" for i in range(8)], range(8)),
        ("the same values again", ["gpu util 97.5% mem 0.81"] * 8, range(8)),
        ("bursts now and then", [f"loss {2 - i / 10:.3f}" for i in range(8)], (0, 1, 30, 31, 70, 71, 100, 101)),
        ("evaluation lines", [f"val loss {2 - i / 10:.3f}" for i in range(8)], range(8)),
    ],
)
def test_what_is_never_a_heartbeat(name: str, lines: list[str], reads: range | tuple[int, ...]) -> None:
    learner = ProgressLearner()
    assert not any(learner.feed(line, read_at=1000.0 + at) for line, at in zip(lines, reads)), name


def test_a_counter_takes_over_from_a_heartbeat() -> None:
    learner = ProgressLearner()
    for i in range(6):
        learner.feed(f"loss {2 - i / 10:.3f}", read_at=1000.0 + i)
    assert learner.feed("loss 1.000", read_at=1006.0).kind == "heartbeat"
    got = [learner.feed(f"step {100 + i}: loss {1 - i / 100:.3f}", read_at=1007.0 + i) for i in range(4)]
    assert got[-1] is not None and got[-1].kind == "counter" and got[-1].step == 103
    assert learner.feed("loss 0.900", read_at=1011.0) is None  # the heartbeat no longer counts


def test_interleaved_eval_lines_do_not_take_the_place_of_the_step_line() -> None:
    learner = ProgressLearner()
    got = []
    for i in range(12):
        got.append(learner.feed(f"it {100 + i} loss {2 - i / 100:.3f}", read_at=1000.0 + i))
        if i % 3 == 2:
            for b in range(3):  # eval batches counted 0, 1, 2 each pass
                learner.feed(f"eval batch {b} val_loss 1.{b}", read_at=1000.0 + i)
    assert [g.step for g in got if g is not None][-1] == 111
    assert learner.learned is not None and "eval" not in learner.learned


def test_a_counter_that_restarts_each_epoch_is_a_step_counter() -> None:
    learner = ProgressLearner()
    got = []
    for i in range(10):
        epoch, batch = divmod(i, 4)
        got.append(learner.feed(f"epoch {epoch} batch {batch}/4 loss 0.{i}", read_at=1000.0 + i))
    assert [g.step for g in got[6:] if g is not None] == [2, 3, 0, 1]


def test_ranks_repeating_the_same_step_in_one_file_still_count() -> None:
    learner = ProgressLearner()
    got = []
    for i in range(5):
        for _ in range(4):  # four ranks print the same line
            got.append(learner.feed(f"step {i * 10}: loss 0.5", read_at=1000.0 + i))
    assert got[-1] is not None and got[-1].step == 40


def test_progress_bars_rewritten_with_carriage_returns() -> None:
    learner = ProgressLearner()
    bar = "".join(f"\rtraining {i}/200 | loss 0.{i}" for i in range(10, 14))
    first = learner.feed(bar, read_at=1000.0)
    second = learner.feed("\rtraining 14/200 | loss 0.5\rtraining 15/200 | loss 0.4", read_at=1001.0)
    assert first is None  # all read at once: time not seen to pass yet
    assert second is not None and (second.step, second.total) == (15, 200)


@pytest.mark.parametrize(("line", "step", "total"), [
    ('{"step": 120, "loss": 2.3, "lr": 0.0001}', 120, None),
    ('{"iter": 10, "total_iters": 500, "loss": 1.0}', 10, 500),
    ('{"epoch": 1, "update": 0.1, "loss": "9.5", "num_updates": "100"}', 100, None),  # fairseq --log-format json
    ('{"global_step": 7, "max_steps": 1000}', 7, 1000),
    ('{"batch": 33}', 33, None),
])
def test_json_lines_name_their_step(line: str, step: int, total: int | None) -> None:
    got = ProgressLearner().feed(line, read_at=1000.0)
    assert got is not None and (got.step, got.total, got.kind) == (step, total, "json")


def test_a_json_line_without_a_step_is_not_progress() -> None:
    assert ProgressLearner().feed('{"loss": 2.3, "lr": 0.001}', read_at=1000.0) is None


def test_a_right_aligned_counter_keeps_its_template_past_a_new_digit() -> None:
    learner = ProgressLearner()
    got = [learner.feed(f"Iter(train) [{step:>5}/1000]  loss: 0.5", read_at=1000.0 + i)
           for i, step in enumerate(range(96, 104))]
    assert [g.step for g in got if g is not None] == [98, 99, 100, 101, 102, 103]


def test_a_new_line_format_takes_over_when_the_learned_one_stops() -> None:
    learner = ProgressLearner()
    for i in range(6):
        learner.feed(f"iter {i} loss 0.5", read_at=1000.0 + i)
    got = [learner.feed(f"[phase 2] update {10 + i} of 500", read_at=1010.0 + i) for i in range(5)]
    assert [g.step for g in got if g is not None] == [12, 13, 14]
    assert learner.learned is not None and "update" in learner.learned


def test_a_counter_learned_on_its_second_read_brings_the_steps_of_the_first() -> None:
    """A fast job prints many steps a read: the first read's steps count once the second read
    shows the counter, at the time they were read (the pace is known at once)."""
    learner = ProgressLearner()
    fed = [learner.feed(f"Iter(train) [{step:>5}/40000]  loss: 0.{step}", 10.0) for step in range(1, 6)]
    assert fed == [None] * 5  # one read: time was not seen to pass
    found = learner.feed("Iter(train) [    6/40000]  loss: 0.6", 11.0)
    assert (found.step, found.total) == (6, 40000)
    assert found.earlier == ((10.0, 1), (10.0, 2), (10.0, 3), (10.0, 4), (10.0, 5))
    # Only the line that taught the counter brings them: the next ones are steps of their own.
    assert learner.feed("Iter(train) [    7/40000]  loss: 0.7", 11.0).earlier == ()


def test_a_heartbeat_learned_on_its_second_read_brings_the_beats_of_the_first() -> None:
    learner = ProgressLearner()
    line = "{{'loss': 0.{n}1, 'grad_norm': 1.{n}2, 'learning_rate': 4.{n}e-05, 'epoch': 0.0{n}}}"
    assert [learner.feed(line.format(n=n), 10.0) for n in range(1, 5)] == [None] * 4
    fed = [learner.feed(line.format(n=n), 11.0) for n in range(5, 8)]
    learned = [f for f in fed if f is not None]
    assert learned and learned[0].kind == "heartbeat" and learned[0].earlier == ((10.0, 4),)
    assert all(f.earlier == () for f in learned[1:])
