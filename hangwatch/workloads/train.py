"""A tiny gloo training job that can go wrong on purpose.

Runs under ``torchrun --nproc-per-node=2 hangwatch/workloads/train.py ...`` or
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
* ``none``             clean finish

When a failure starts, the affected rank prints ``HANGWATCH-STALL t=<epoch> ...``
so that benchmarks can time the detection.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

MODES = ("none", "exit", "exit-error", "linger", "extra-collective", "straggle", "busy-all")


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
    p.add_argument("--threads", type=int, default=1)
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
        print(prefix + msg, flush=True)


def mark_stall(rank: int, mode: str, step: int) -> None:
    print(f"HANGWATCH-STALL t={time.time():.3f} mode={mode} rank={rank} step={step}", flush=True)


def load_batch(gen: torch.Generator, batch: int):
    """Stands in for a data loader: a short wait, then a random batch."""
    time.sleep(ARGS.step_sleep)
    x = torch.randn(batch, 32, generator=gen)
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(batch, 1, generator=gen)
    return x, y


def sync_grads(model: nn.Module, world_size: int, use_async: bool) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if use_async:
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for work in works:
            work.wait()
    else:
        for g in grads:
            dist.all_reduce(g)
    for g in grads:
        g.div_(world_size)


def save_checkpoint(model: nn.Module, rank: int, op: str) -> None:
    """The classic bug: a collective inside a rank-0-only code path."""
    if op == "barrier":
        dist.barrier()
    else:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        dist.broadcast(flat, src=rank)


def busy_compute(seconds: float) -> None:
    """Heavy local work (no collective): evaluation, a slow data transform, ..."""
    a = torch.randn(256, 256)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


def linger_forever() -> None:
    while True:
        time.sleep(3600)


ARGS = None


def main(argv=None) -> int:
    global ARGS
    args = ARGS = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    log(rank, args, f"init done: rank {rank}/{world_size} pid {os.getpid()} fail={args.fail}")

    model = MLP(args.hidden)
    train_model = model
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234 + rank)
    fails_here = args.fail != "none" and (args.fail == "busy-all" or rank == args.fail_rank)

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

        x, y = load_batch(gen, args.batch)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(train_model(x), y)
        loss.backward()
        if not args.ddp and world_size > 1:
            sync_grads(model, world_size, args.async_allreduce)
        opt.step()
        log(rank, args, f"step {step}/{args.steps} | loss {loss.item():.4f} | dt {time.monotonic() - t0:.3f}s")

    dist.barrier()
    log(rank, args, "training finished")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
