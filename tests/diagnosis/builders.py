"""Small builders for diagnosis inputs: a table row reads like the situation it describes."""

from __future__ import annotations

from monitor.diagnosis import ExitView, Frame, JobView, RankView, Stack

NOW = 1_000_000.0
TORCH_C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
TORCH_GRAPH = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py"
TORCH_TENSOR = "/venv/lib/python3.11/site-packages/torch/_tensor.py"
TRAIN = "/work/job/train.py"


def py(name: str, file: str = TRAIN, line: int = 1) -> Frame:
    return Frame(name, file, line)


def native(name: str) -> Frame:
    return Frame(name, "", None, native=True)


def collective(kind: str, line: int, caller: str = "train_step") -> tuple[Frame, ...]:
    return (py(kind, TORCH_C10D, 2950), py("wrapper", TORCH_C10D.replace("distributed_c10d", "c10d_logger"), 81),
            py(caller, TRAIN, line), py("main", TRAIN, 120), py("<module>", TRAIN, 130))


def saving_checkpoint() -> tuple[Frame, ...]:
    return (py("_save", "/venv/lib/python3.11/site-packages/torch/serialization.py", 880),
            py("save", "/venv/lib/python3.11/site-packages/torch/serialization.py", 650),
            py("save_checkpoint", TRAIN, 140), py("main", TRAIN, 110))


def evaluating() -> tuple[Frame, ...]:
    return (py("forward", TRAIN, 30), py("evaluate", TRAIN, 150), py("main", TRAIN, 112))


def launcher_rendezvous() -> tuple[Frame, ...]:
    elastic = "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py"
    return (py("next_rendezvous", elastic, 60), py("_rendezvous", "/venv/lib/python3.11/site-packages/torch/"
            "distributed/elastic/agent/server/api.py", 500), py("main", "/venv/bin/torchrun", 8))


def sleeping(line: int = 99) -> tuple[Frame, ...]:
    return (py("main", TRAIN, line), py("<module>", TRAIN, 130))


def computing() -> tuple[Frame, ...]:
    return (py("heavy_compute", TRAIN, 70), py("main", TRAIN, 110), py("<module>", TRAIN, 130))


def ddp_backward() -> tuple[Frame, ...]:
    return (py("_engine_run_backward", TORCH_GRAPH, 829), py("backward", TORCH_TENSOR, 625),
            py("train_step", TRAIN, 60), py("main", TRAIN, 110))


def async_wait_native() -> tuple[Frame, ...]:
    return (native("pthread_cond_wait"), native("c10d::ProcessGroupGloo::AsyncWork::wait"),
            py("sync_grads", TRAIN, 50), py("main", TRAIN, 110))


def init_pg() -> tuple[Frame, ...]:
    return (py("_new_process_group_helper", TORCH_C10D, 2000), py("init_process_group", TORCH_C10D, 1700),
            py("main", TRAIN, 20))


def stack(frames: tuple[Frame, ...], at: float = NOW - 1, active: bool | None = False) -> Stack:
    return Stack(taken_at=at, frames=frames, native=any(f.native for f in frames), active=active)


def steps(last: float, every: float, count: int = 20) -> tuple[float, ...]:
    return tuple(last - every * i for i in reversed(range(count)))


def rank(
    r: int,
    *,
    cpu: float | None = 0.0,
    frames: tuple[Frame, ...] | None = None,
    stack_at: float = NOW - 1,
    active: bool | None = False,
    alive: bool = True,
    exit: ExitView | None = None,
    state: str = "S",
    state_since: float | None = None,
    progress: tuple[float, ...] = (),
    idle_since: float | None = None,
    bytes_per_s: float = 0.0,
    first_seen: float = NOW - 60,
    node: str = "node-a",
    **extra,
) -> RankView:
    return RankView(
        rank=r, node=node, pid=1000 + r, alive=alive, observed_at=NOW, first_seen_at=first_seen,
        exit=exit, proc_state=None if not alive else state,
        state_since=state_since if state_since is not None else NOW - 30,
        cpu_percent=cpu if alive else None, idle_since=idle_since, write_bytes_per_s=bytes_per_s,
        progress_times=progress,
        stack=stack(frames, stack_at, active) if frames is not None else None,
        **extra,
    )


def job(*ranks: RankView, world_size: int | None = None, progress: tuple[float, ...] = (), **kw) -> JobView:
    return JobView(
        job_id="127.0.0.1:29500", world_size=world_size or len(ranks), now=NOW,
        first_seen_at=NOW - 60, ranks=tuple(ranks), job_progress_times=progress, **kw,
    )
