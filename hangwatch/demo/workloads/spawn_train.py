"""train.py under ``torch.multiprocessing.spawn``: the ranks get their rank inside Python.

The parent picks nothing up from its environment; each spawned process sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT in ``os.environ`` itself (the pattern of
PyTorch's DDP tutorial), so /proc/PID/environ of the ranks says nothing about them.

    python spawn_train.py --nprocs 2 --port 29500 -- --fail linger
"""

from __future__ import annotations

import argparse
import os
import sys

import torch.multiprocessing as mp


def run_rank(index: int, world_size: int, port: int, train_argv: list[str]) -> None:
    os.environ.update({"RANK": str(index), "LOCAL_RANK": str(index), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    from hangwatch.demo.workloads import train

    train.leave(train.main(train_argv))  # without torch's thread teardown: see train.leave


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: train.py's arguments")
    args = p.parse_args(argv)
    train_argv = [a for a in args.train_args if a != "--"]
    mp.spawn(run_rank, args=(args.nprocs, args.port, train_argv), nprocs=args.nprocs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
