"""What a rank's stack says it is doing: waiting in a collective, in rendezvous, or elsewhere.

Python frames come from ``py-spy dump``; native frames (``--native``) are interleaved
with them. Only the main thread is looked at: that is where training code runs.
"""

from __future__ import annotations

import functools

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from monitor.diagnosis.model import Frame, Stack

T = TypeVar("T")

# torch.distributed Python entry points that block until peers take part.
COLLECTIVE_FUNCTIONS = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_reduce_multigpu",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "all_gather",
        "all_gather_into_tensor",
        "_all_gather_base",
        "all_gather_object",
        "all_gather_coalesced",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "all_to_all",
        "all_to_all_single",
        "send",
        "recv",
        "send_object_list",
        "recv_object_list",
        "batch_isend_irecv",
    }
)

# Collectives a training step runs every iteration; a rank parked in one of the
# others (barrier, broadcast, object collectives) is more likely the odd one out.
REGULAR_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "all_gather_into_tensor",
        "_all_gather_base",
        "ddp_backward",
        "work_wait",
        "cuda_sync",
    }
)

RENDEZVOUS_FUNCTIONS = frozenset(
    {
        "init_process_group",
        "_new_process_group_helper",
        "new_group",
        "rendezvous",
        "_env_rendezvous_handler",
        "_tcp_rendezvous_handler",
        "_create_c10d_store",
        "_store_based_barrier",
        "next_rendezvous",
        "_rendezvous",
        "init_device_mesh",
    }
)

# Native symbols that mean "blocked on a collective's completion".
NATIVE_WAIT_MARKERS = (
    "Work::wait",
    "Work::synchronize",
    "Reducer::finalize_backward",
    "Reducer::",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "cudaStreamSynchronize",
    "gloo::",
)

_TORCH_DIRS = ("torch/", "torch\\")


@dataclass(frozen=True)
class WaitPoint:
    """Where a rank waits: ``kind`` is the collective (or ``rendezvous``), ``call_site``
    the innermost frame of the caller's own code."""

    kind: str
    call_site: str  # "train.py:50"
    detail: str  # human text: "all_reduce called from sync_grads (train.py:50)"

    @functools.cached_property
    def site(self) -> str:
        # Worked out once per wait point: a pass over a giant job asks each rank's (shared) point twice.
        return f"{self.kind}@{self.call_site}"

    @property
    def is_rendezvous(self) -> bool:
        return self.kind == "rendezvous"


def _is_torch(frame: Frame) -> bool:
    short = frame.short_file
    return short.startswith(_TORCH_DIRS) or "/torch/" in frame.file


def python_frames(stack: Stack) -> list[Frame]:
    return [f for f in stack.frames if not f.native]


# Answers shared by stacks with the same frames (the ranks of a job mostly sit in the same few
# places): (key, frames, active) -> answer. Cleared when full; it refills from the next pass.
_SHARED_KEPT = 1 << 15
_shared: dict[tuple[object, tuple[Frame, ...], bool | None], object] = {}
_MISSING = object()


def memo(stack: Stack, key: object, compute: Callable[[], T]) -> T:
    """What ``compute`` says of ``stack`` (from its frames and ``active`` alone), worked out once per
    stack and once per distinct stack content: a dump is read by every pass until the next one,
    and 10,000 ranks parked in one collective send 10,000 dumps of the same frames."""
    cache = stack.__dict__.setdefault("_memo", {})
    if key in cache:
        return cache[key]  # type: ignore[no-any-return]
    shared_key = (key, stack.frames, stack.active)
    value = _shared.get(shared_key, _MISSING)
    if value is _MISSING:
        value = compute()
        if len(_shared) >= _SHARED_KEPT:
            _shared.clear()
        _shared[shared_key] = value
    cache[key] = value
    return value  # type: ignore[return-value]


_WAIT_LOW_CPU, _WAIT_BUSY = ("wait", True), ("wait", False)


def _memo_hit(stack: Stack, key: object) -> object:
    """``memo``'s answer for ``stack`` if it has one, else _MISSING: no closure made on a hit (a pass
    over 100,000 ranks asks each rank's stack twice)."""
    cache = stack.__dict__.get("_memo")
    return _MISSING if cache is None else cache.get(key, _MISSING)


def top_python_frame(stack: Stack | None) -> Frame | None:
    if stack is None:
        return None
    known = _memo_hit(stack, "top")
    if known is not _MISSING:
        return known  # type: ignore[return-value]
    return memo(stack, "top", lambda: next(iter(python_frames(stack)), None))


def top_frame_text(stack: Stack | None) -> str | None:
    """``top_python_frame(stack).where()``, worked out once per stack."""
    if stack is None:
        return None
    known = _memo_hit(stack, "top_text")
    if known is not _MISSING:
        return known  # type: ignore[return-value]

    def text() -> str | None:
        top = top_python_frame(stack)
        return top.where() if top is not None else None

    return memo(stack, "top_text", text)


def _caller(frames: list[Frame], start: int) -> Frame | None:
    """The innermost frame at or above ``start`` that is not torch's own code."""
    for frame in frames[start:]:
        if not _is_torch(frame):
            return frame
    return None


def _point(kind: str, frames: list[Frame], index: int) -> WaitPoint:
    caller = _caller(frames, index)
    if caller is None:
        at = frames[index]
        return WaitPoint(kind, f"{at.short_file}:{at.line}", f"{kind} ({at.where()})")
    call_site = f"{caller.short_file}:{caller.line}"
    return WaitPoint(kind, call_site, f"{kind} called from {caller.where()}")


def _has_native_wait(stack: Stack) -> bool:
    return any(f.native and any(m in f.name for m in NATIVE_WAIT_MARKERS) for f in stack.frames)


def wait_point(stack: Stack | None, cpu_percent: float | None = None) -> WaitPoint | None:
    """The collective or rendezvous the main thread is blocked in, or None.

    Decided from frames, never from CPU alone: a rank hung in NCCL can spin at
    100% CPU. CPU only disambiguates the one frame that is ambiguous on its own
    (autograd's backward engine, which both computes and waits for DDP's reducer).
    """
    if stack is None:
        return None
    # CPU decides only whether an ambiguous frame waits: below 20% or not.
    low_cpu = cpu_percent is not None and cpu_percent < 20
    key = _WAIT_LOW_CPU if low_cpu else _WAIT_BUSY
    known = _memo_hit(stack, key)
    if known is not _MISSING:
        return known  # type: ignore[return-value]
    return memo(stack, key, lambda: _wait_point(stack, low_cpu))


def _wait_point(stack: Stack, low_cpu: bool) -> WaitPoint | None:
    frames = python_frames(stack)
    for i, frame in enumerate(frames):
        if _is_torch(frame) and frame.name in RENDEZVOUS_FUNCTIONS:
            return _point("rendezvous", frames, i)
    for i, frame in enumerate(frames):
        if "distributed" in frame.short_file and frame.name in COLLECTIVE_FUNCTIONS:
            return _point(frame.name, frames, i)
    native_wait = _has_native_wait(stack)
    for i, frame in enumerate(frames):
        if frame.name == "_engine_run_backward" or frame.name == "run_backward":
            idle = stack.active is False or low_cpu
            if native_wait or idle:
                return _point("ddp_backward", frames, i)
            return None
    if native_wait and frames:
        # Async collective: Python shows only the caller of work.wait(); with NCCL, a
        # queued collective blocks the next stream synchronisation (.item(), .cpu()).
        only_cuda = all("cudaStreamSynchronize" in f.name for f in stack.frames
                        if f.native and any(m in f.name for m in NATIVE_WAIT_MARKERS))
        return _point("cuda_sync" if only_cuda else "work_wait", frames, 0)
    return None


def wait_site(stack: Stack | None, cpu_percent: float | None = None) -> str | None:
    """``kind@file:line`` of the wait, for grouping ranks and remembering sync points."""
    point = wait_point(stack, cpu_percent)
    return None if point is None or point.is_rendezvous else point.site
