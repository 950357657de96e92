"""A tiny gloo training job that can go wrong on purpose.

Runs under ``torchrun --nproc-per-node=2 hangwatch/demo/workloads/train.py ...`` or
under any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
itself. A small MLP learns random data; gradients are synchronised with
``dist.all_reduce`` (or by DistributedDataParallel with ``--ddp``).

Progress lines look like ``step 12/1000 | loss 0.1234 | dt 0.05s`` (rank 0
only, unless ``--log-all-ranks``, which prefixes every line with ``[rankN]:``).

Failure modes (``--fail MODE``), starting at step ``--fail-at-step`` on rank
``--fail-rank``:

* ``exit``             the rank leaves the loop and exits 0 (its data ran out)
* ``exit-error``       the rank raises an exception
* ``linger``           the rank leaves the loop and sleeps forever (alive, 0% CPU)
* ``extra-collective`` the rank runs a collective the others do not
                       (``save_checkpoint`` -> ``dist.broadcast`` or ``dist.barrier``)
* ``straggle``         the rank computes for ``--busy-seconds`` before its next all_reduce
* ``busy-all``         every rank computes for ``--busy-seconds`` (no collective)
* ``slow-rank``        from then on the rank computes ``--slow-factor`` times ``--step-seconds``
                       per step: a steady straggler that the others wait for, the job still stepping
* ``checkpoint``       the rank (rank 0 by convention: ``--fail-rank 0``) writes a checkpoint
                       file for ``--busy-seconds`` while the others wait at ``dist.barrier()``
                       (``if rank == 0: save(); dist.barrier()``): healthy, not a hang
* ``eval``             every ``--eval-every`` steps (default: ``--fail-at-step``) every rank runs
                       an evaluation pass of ``--busy-seconds``, printing ``eval ...`` lines
* ``get-future``       every rank calls ``dist.reduce_scatter_tensor(..., async_op=True)
                       .get_future()`` (as nanochat's DistMuonAdamW does): gloo raises
                       ``RuntimeError: Work::getFuture not implemented`` (all_reduce's Work
                       does implement it on torch 2.13, reduce_scatter's does not)
* ``stuck-save``       the rank (``--fail-rank 0``) calls ``torch.save`` to a path whose open never
                       returns (a FIFO nobody reads, as a hung network mount blocks an open) while the
                       others wait at ``dist.barrier()``: rank 0 at 0% CPU in torch/serialization.py
* ``eval-alone``       the rank (``--fail-rank 0``) runs an evaluation pass of ``--busy-seconds`` on its
                       own (no collective in it) while the others wait at ``dist.barrier()``: healthy
* ``none``             clean finish

Other knobs: ``--first-step-seconds S`` (every rank computes S seconds in step 1, like a
``torch.compile`` warm-up), ``--step-seconds S`` (every step computes S seconds: a job with a
slow cadence), ``--dtype bfloat16`` (prints ``COMPUTE_DTYPE: torch.bfloat16`` at start, as
nanochat does, and computes in bf16, also in busy phases). ``main`` is wrapped in
torchelastic's ``@record``: under torchrun a crash writes its traceback to
``TORCHELASTIC_ERROR_FILE``. ``--fr-dump-every S`` writes the rank's Flight Recorder dump
(``torch._C._distributed_c10d._dump_fr_trace()``, what NCCL's watchdog writes on a timeout) to
``$TORCH_FR_DUMP_TEMP_FILE<rank>`` every S seconds, from a thread, also while the rank hangs.
``--log-every N`` prints the step line every N steps only (Megatron-LM's ``--log-interval``);
``--heartbeat-every S`` starts a thread on every rank that prints ``[hb] rank R beat N uptime Ts``
every S seconds, whatever the training loop does (a liveness ping, as many stacks have).

When a failure starts, the affected rank prints ``HANGWATCH-STALL t=<epoch> ...``
so that benchmarks can time the detection.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import tempfile
import threading
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

MODES = ("none", "exit", "exit-error", "linger", "extra-collective", "straggle", "busy-all", "checkpoint", "eval",
         "get-future", "slow-rank", "stuck-save", "eval-alone")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The step line in each --log-format; "mmengine" as mmengine's LogProcessor writes it, "json" as
# a JSON-lines logger would.
STEP_LINES = {
    "plain": "step {step}/{steps} | loss {loss:.4f} | dt {dt:.3f}s",
    "mmengine": "{date} - mmengine - INFO - Iter(train) [{step:>5}/{steps}]  lr: 1.0000e-02  eta: 0:{eta:02d}:00  "
                "time: {dt:.4f}  data_time: 0.0100  memory: 321  loss: {loss:.4f}",
    "json": '{{"iter": {step}, "max_iters": {steps}, "loss": {loss:.4f}, "time": {dt:.4f}}}',
    # transformers' Trainer: a dict of floats and no step number, progress only as a steady pace.
    "hf": "{{'loss': {loss:.4f}, 'grad_norm': {dt:.4f}, 'learning_rate': 5e-05, 'epoch': {epoch:.4f}}}",
    "none": "",  # no step line at all
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--fail", choices=MODES, default="none")
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-at-step", type=int, default=20)
    p.add_argument("--ddp", action="store_true", help="wrap the model in DistributedDataParallel")
    p.add_argument("--async-allreduce", action="store_true",
                   help="manual gradient sync with async_op=True and work.wait()")
    p.add_argument("--extra-op", choices=("broadcast", "barrier"), default="broadcast",
                   help="the collective that --fail extra-collective runs on one rank")
    p.add_argument("--busy-seconds", type=float, default=60.0,
                   help="how long straggle / busy-all compute")
    p.add_argument("--step-sleep", type=float, default=0.05,
                   help="simulated data-loading time per step (seconds)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--log-all-ranks", action="store_true")
    p.add_argument("--log-file", default=None,
                   help="write the log lines to this file (logging.FileHandler, appending) instead of stdout, "
                        "as code that logs to a file of its own does")
    p.add_argument("--log-format", choices=tuple(STEP_LINES), default="plain",
                   help="how the step line reads: plain ('step N/M | loss'), or as mmengine or JSON lines "
                        "print it (formats no built-in pattern of the agent knows: it has to learn them), "
                        "or none: no step line at all")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=0, help="eval mode: steps between passes (0: --fail-at-step)")
    p.add_argument("--first-step-seconds", type=float, default=0.0, help="extra compute in step 1 (warm-up)")
    p.add_argument("--step-seconds", type=float, default=0.0, help="compute time of every step")
    p.add_argument("--compute-share", type=float, default=1.0,
                   help="the share of a core --first-step-seconds, --step-seconds and an eval pass compute at, "
                        "by the CPU the process gets (asleep while ahead): a busy rank all the same, at a lighter "
                        "load on a shared test machine")
    p.add_argument("--slow-factor", type=float, default=1.3, help="slow-rank mode: that rank's step compute, x")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--checkpoint-dir", default=None, help="checkpoint mode: where to write (default: $TMPDIR)")
    p.add_argument("--checkpoint-burst-mb", type=int, default=1, help="checkpoint mode: MB written per fsync")
    p.add_argument("--checkpoint-pause", type=float, default=0.02, help="checkpoint mode: pause after each fsync (s)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: NCCL on the GPU (several ranks may share one GPU, each posing as its own host)")
    p.add_argument("--worker-server", action="store_true",
                   help="run under torch's worker_main with a worker server socket (stacks and Flight Recorder "
                        "over a unix socket, no ptrace)")
    p.add_argument("--fr-dump-every", type=float, default=0.0,
                   help="write the Flight Recorder dump to $TORCH_FR_DUMP_TEMP_FILE<rank> every S seconds (0: never)")
    p.add_argument("--log-every", type=int, default=1, help="print the step line every N steps only")
    p.add_argument("--heartbeat-every", type=float, default=0.0,
                   help="a side thread on every rank prints '[hb] rank R beat N uptime Ts' every S seconds (0: none)")
    return p.parse_args(argv)


class MLP(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, x):
        return self.net(x)


def log(rank: int, args, msg: str, *, always: bool = False) -> None:
    if always or args.log_all_ranks or rank == 0:
        prefix = f"[rank{rank}]:" if args.log_all_ranks else ""
        if args.log_file:
            file_logger(args.log_file).info(prefix + msg)
        else:
            print(prefix + msg, flush=True)


@functools.cache
def file_logger(path: str) -> logging.Logger:
    """A logger writing to ``path`` through logging.FileHandler (mode "a"; it flushes each record)."""
    logger = logging.getLogger("train")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger


class PlainSGD:
    """Plain SGD (p -= lr * grad), in place of torch.optim.SGD.

    The first torch.optim optimizer a process builds imports torch._dynamo (and FSDP with it):
    3-4 CPU-seconds, twice what ``import torch`` costs, in every rank of every job the tests and
    the demo start. What the product watches (collectives, stacks, steps, logs) is the same.
    """

    def __init__(self, params, lr: float) -> None:  # type: ignore[no-untyped-def]
        self.params, self.lr = list(params), lr

    def zero_grad(self, set_to_none: bool = True) -> None:  # always to None; the argument as torch.optim takes it
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


def mark_stall(rank: int, mode: str, step: int) -> None:
    print(f"HANGWATCH-STALL t={time.time():.3f} mode={mode} rank={rank} step={step}", flush=True)


def load_batch(gen: torch.Generator, batch: int):
    """Stands in for a data loader: a short wait, then a random batch."""
    time.sleep(ARGS.step_sleep)
    x = torch.randn(batch, 32, generator=gen)
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(batch, 1, generator=gen)
    return x, y


def sync_grads(model: nn.Module, world_size: int, use_async: bool) -> None:
    """Average the gradients: one all_reduce of them all in one flat bucket, as DDP's buckets do (an
    all_reduce per tensor cost twice the CPU per step on gloo, mostly in system calls, and the
    suite's jobs step for minutes in all); with ``use_async``, an async all_reduce per tensor and a
    ``work.wait()`` for each."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if use_async:
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for work in works:
            work.wait()
    else:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        for g, reduced in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(reduced.view_as(g))
    for g in grads:
        g.div_(world_size)


def save_checkpoint(model: nn.Module, rank: int, op: str) -> None:
    """The classic bug: a collective inside a rank-0-only code path."""
    if op == "barrier":
        dist.barrier()
    else:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        dist.broadcast(flat, src=rank)
        if flat.is_cuda:
            torch.cuda.synchronize()  # NCCL queues it: wait here, as a real save would


def busy_compute(seconds: float, share: float = 1.0) -> None:
    """Heavy local work (no collective): evaluation, a slow data transform, ... On a GPU the
    rank grinds there, synchronising each round so the time is real. ``share`` < 1: computes
    until the process has had that share of a core since the start, and sleeps while it is ahead
    (see --compute-share)."""
    a = torch.randn(256, 256, dtype=DTYPE, device=DEVICE)
    start = time.monotonic()
    end = start + seconds
    cpu_at_start = time.process_time()
    while (now := time.monotonic()) < end:
        if share < 1.0:
            # Paced by the CPU the process got, not by the clock: on a crowded machine a rank that
            # computed a share of each tenth of a second by the clock got a share of what the
            # kernel gave it, and could read idle. This one computes on until it has had its share.
            ahead_s = (time.process_time() - cpu_at_start) / share - (now - start)
            if ahead_s > 0:
                time.sleep(min(ahead_s, end - now, 0.1))
                continue
        a = torch.tanh(a @ a)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()


def write_checkpoint(model: nn.Module, rank: int, seconds: float, directory: str | None,
                     burst_mb: int = 1, pause_s: float = 0.02) -> None:
    """A long checkpoint save: serialise the weights and write them out again and again, in
    bursts of ``burst_mb`` MB, each flushed with fsync and followed by a ``pause_s`` pause
    (1 s pauses: the bursty saves that used to make the verdict flap)."""
    import tempfile

    path = os.path.join(directory or tempfile.gettempdir(), f"hangwatch-ckpt-{os.getpid()}.pt")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    padding = torch.randn(256 * 1024)  # 1 MB per write, like a bigger model's shards
    end = time.monotonic() + seconds
    written = 0
    try:
        with open(path, "wb") as f:
            while time.monotonic() < end:
                for _ in range(max(1, burst_mb)):
                    torch.save({"model": state, "padding": padding}, f)
                    written += 1
                f.flush()
                os.fsync(f.fileno())
                time.sleep(pause_s)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    print(f"rank {rank}: checkpoint saved ({written} writes to {path})", flush=True)


def evaluate(model: nn.Module, rank: int, step: int, seconds: float, batch: int, compute_share: float = 1.0) -> float:
    """An evaluation pass: forward only, no collective until the end (then the mean val loss)."""

    def say(n: int, mean: float) -> None:
        if n % 10 == 0:
            print(f"[rank{rank}]: eval step {step} batch {n} | val loss {mean:.4f}", flush=True)

    val = torch.tensor([evaluate_alone(model, seconds, batch, compute_share, say)])
    dist.all_reduce(val)
    return float(val) / dist.get_world_size()


def evaluate_alone(model: nn.Module, seconds: float, batch: int, compute_share: float = 1.0,
                   say=None) -> float:  # type: ignore[no-untyped-def]
    """An evaluation pass on this rank alone (also ``if rank == 0: evaluate(); dist.barrier()``): no
    collective; ``say(batches, mean loss)`` after each batch."""
    gen = torch.Generator().manual_seed(99)
    end = time.monotonic() + seconds
    n, total = 0, 0.0
    with torch.no_grad():
        while time.monotonic() < end:
            x = torch.randn(batch * 64, 32, generator=gen).to(DTYPE).to(DEVICE)
            total += float(nn.functional.mse_loss(model(x), x[:, :1] * 0.5))
            busy_compute(0.2, compute_share)
            n += 1
            if say is not None:
                say(n, total / n)
    return total / max(n, 1)


def get_future_sync(model: nn.Module, world_size: int) -> None:
    """nanochat's DistMuonAdamW pattern: reduce_scatter(async_op=True).get_future() (NCCL only)."""
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    flat = nn.functional.pad(flat, (0, (-flat.numel()) % world_size))
    out = torch.empty(flat.numel() // world_size, dtype=flat.dtype, device=flat.device)
    fut = dist.reduce_scatter_tensor(out, flat, async_op=True).get_future()
    fut.wait()


def dump_flight_recorder_every(seconds: float, rank: int) -> None:
    """gloo has no watchdog that dumps: a thread writes what torch would, where torch would.
    The thread runs while the main thread waits in a collective (gloo's wait lets go of the GIL)."""
    from torch._C._distributed_c10d import _dump_fr_trace

    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not prefix:
        return
    path = f"{prefix}{rank}"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def loop() -> None:
        while True:
            time.sleep(seconds)
            with open(path + ".tmp", "wb") as f:
                f.write(_dump_fr_trace())
            os.replace(path + ".tmp", path)  # whole dumps only

    threading.Thread(target=loop, name="fr-dump", daemon=True).start()


def heartbeat_every(seconds: float, rank: int) -> None:
    """A liveness ping from a thread of its own: it beats while the training loop is stuck."""
    started = time.monotonic()

    def loop() -> None:
        beat = 0
        while True:
            time.sleep(seconds)
            beat += 1
            print(f"[hb] rank {rank} beat {beat} uptime {time.monotonic() - started:.1f}s", flush=True)

    threading.Thread(target=loop, name="heartbeat", daemon=True).start()


def save_to_hung_path(model: nn.Module, directory: str | None) -> None:
    """torch.save to a path whose open blocks forever: a FIFO that no process reads (opening one
    for writing waits for a reader), as an open on a hung network mount does."""
    path = os.path.join(directory or tempfile.gettempdir(), f"hangwatch-hung-ckpt-{os.getpid()}.pt")
    if not os.path.exists(path):
        os.mkfifo(path)
    print(f"saving checkpoint to {path}", flush=True)
    torch.save(model.state_dict(), path)


def linger_forever() -> None:
    while True:
        time.sleep(3600)


ARGS = None
DTYPE = torch.float32
DEVICE = torch.device("cpu")


def init_distributed(device: str) -> torch.device:
    """gloo on the CPU; NCCL on a GPU. Ranks sharing one GPU each pose as their own host
    (NCCL_HOSTID), else NCCL refuses a second rank on the device (see FIELD-NOTES)."""
    if device == "cpu":
        dist.init_process_group(backend="gloo")
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = local_rank % torch.cuda.device_count()
    if torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault("NCCL_HOSTID", f"hangwatch-rank{os.environ.get('RANK', local_rank)}")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    torch.cuda.set_device(gpu)
    dist.init_process_group(backend="nccl", device_id=torch.device("cuda", gpu))
    return torch.device("cuda", gpu)


@record
def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.worker_server:
        return train(args)
    # torch's worker server on a unix socket of this rank's own (the variable set here, after the
    # rank started, so an agent finds the socket by what the rank listens on, not by its environment).
    os.environ.setdefault("TORCH_WORKER_SERVER_SOCKET",
                          os.path.join(tempfile.gettempdir(), f"hangwatch-worker-{os.getpid()}.sock"))
    from torch.distributed.elastic.control_plane import worker_main

    with worker_main():
        return train(args)


def train(args) -> int:
    global ARGS, DTYPE, DEVICE
    ARGS = args
    DTYPE = DTYPES[args.dtype]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"COMPUTE_DTYPE: {DTYPE} (--dtype {args.dtype})", flush=True)

    DEVICE = init_distributed(args.device)
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    log(rank, args, f"init done: rank {rank}/{world_size} pid {os.getpid()} fail={args.fail}")
    if args.fr_dump_every > 0:
        dump_flight_recorder_every(args.fr_dump_every, rank)
    if args.heartbeat_every > 0:
        heartbeat_every(args.heartbeat_every, rank)

    model = MLP(args.hidden).to(DTYPE).to(DEVICE)
    train_model = model
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model)
    opt = PlainSGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234 + rank)
    fails_here = args.fail != "none" and (args.fail in ("busy-all", "eval", "get-future")
                                          or rank == args.fail_rank)
    eval_every = args.eval_every or args.fail_at_step

    for step in range(1, args.steps + 1):
        t0 = time.monotonic()
        if fails_here and step == args.fail_at_step:
            if args.fail == "exit":
                mark_stall(rank, args.fail, step)
                print(f"rank {rank}: data exhausted at step {step}, leaving the training loop", flush=True)
                return 0
            if args.fail == "exit-error":
                mark_stall(rank, args.fail, step)
                raise RuntimeError(f"simulated failure on rank {rank} at step {step}")
            if args.fail == "linger":
                mark_stall(rank, args.fail, step)
                print(f"rank {rank}: data exhausted at step {step}, waiting for the others", flush=True)
                linger_forever()
            if args.fail == "extra-collective":
                mark_stall(rank, args.fail, step)
                save_checkpoint(model, rank, args.extra_op)
            if args.fail in ("straggle", "busy-all"):
                mark_stall(rank, args.fail, step)
                busy_compute(args.busy_seconds)
        if args.fail == "checkpoint" and step == args.fail_at_step:
            # The usual code: rank 0 saves, everybody meets at a barrier afterwards.
            if rank == args.fail_rank:
                mark_stall(rank, args.fail, step)
                print(f"rank {rank}: saving checkpoint at step {step}", flush=True)
                write_checkpoint(model, rank, args.busy_seconds, args.checkpoint_dir,
                                 args.checkpoint_burst_mb, args.checkpoint_pause)
            dist.barrier()
        if args.fail == "stuck-save" and step == args.fail_at_step:
            if rank == args.fail_rank:
                mark_stall(rank, args.fail, step)
                save_to_hung_path(model, args.checkpoint_dir)
            dist.barrier()
        if args.fail == "eval-alone" and step == args.fail_at_step:
            if rank == args.fail_rank:
                mark_stall(rank, args.fail, step)
                evaluate_alone(model, args.busy_seconds, args.batch, args.compute_share)
            dist.barrier()
        if args.fail == "eval" and step % eval_every == 0:
            mark_stall(rank, args.fail, step)
            val = evaluate(model, rank, step, args.busy_seconds, args.batch, args.compute_share)
            log(rank, args, f"eval step {step} | val loss {val:.4f}")
        if step == 1 and args.first_step_seconds > 0:
            mark_stall(rank, "first-step", step)
            busy_compute(args.first_step_seconds, args.compute_share)
        if args.step_seconds > 0:
            if step == 1 and args.fail != "slow-rank":  # there the slow-down is the failure to time
                mark_stall(rank, "step-seconds", step)
            slow = fails_here and args.fail == "slow-rank" and step >= args.fail_at_step
            if slow and step == args.fail_at_step:
                mark_stall(rank, args.fail, step)
            busy_compute(args.step_seconds * (args.slow_factor if slow else 1.0), args.compute_share)

        x, y = load_batch(gen, args.batch)
        x, y = x.to(DTYPE).to(DEVICE), y.to(DTYPE).to(DEVICE)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(train_model(x), y)
        loss.backward()
        if fails_here and args.fail == "get-future" and step >= args.fail_at_step:
            if step == args.fail_at_step:
                mark_stall(rank, args.fail, step)
            get_future_sync(model, world_size)
        elif not args.ddp and world_size > 1:
            sync_grads(model, world_size, args.async_allreduce)
        opt.step()
        if args.log_format != "none" and (step % args.log_every == 0 or step == args.steps):
            log(rank, args, STEP_LINES[args.log_format].format(
                step=step, steps=args.steps, loss=loss.item(), dt=time.monotonic() - t0,
                date=time.strftime("%Y/%m/%d %H:%M:%S"), eta=(args.steps - step) // 60 % 60,
                epoch=step / args.steps))

    dist.barrier()
    log(rank, args, "training finished")
    dist.destroy_process_group()
    return 0


def leave(code: int) -> None:
    """End the process with ``code`` without Python's teardown of torch's threads.

    Seen in CI (torch 2.13, gloo): a rank that left main() normally, after a clean finish or a
    planned early exit with the process group still up, sometimes aborted in that teardown
    ("terminate called without an active exception", SIGABRT). The workload's exits are the
    cases' facts, so every normal return leaves this way; a raised exception still ends through
    the interpreter, which prints its traceback.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main() or 0)
