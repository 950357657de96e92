"""The ranks' main-thread stacks merged into one tree, outermost frame first (STAT's prefix tree).

Each node is a frame with the ranks whose stack passes through it and the job's ranks that do
not (``missing``): the odd rank out shows as the one missing under the frame its peers wait in.
Native frames (py-spy ``--native``, taken for stuck ranks) are kept and flagged so the page can
fold them, except the interpreter's start-up frames outside the outermost Python frame. Rank sets are written as ranges (``0-6,8``), so a node costs the same at 10,000 ranks.

Bounded: at most ``MAX_DEPTH`` innermost frames of a stack (where a rank waits is innermost; the
outer frames are the common ``<module>``/``main`` prefix), and at most ``MAX_DISTINCT_STACKS``
distinct stacks merged, the most common first; ranks of the rest are listed as ``not_merged``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.diagnosis import Frame, RankView
from monitor.rank_ranges import ranks_text

MAX_DEPTH = 96
MAX_DISTINCT_STACKS = 64

FrameKey = tuple[str, bool]


def stack_tree(ranks: Sequence[RankView], world_size: int | None) -> dict[str, Any]:
    """The merged tree of the live ranks' stacks; ranks are the job's (seen or within its world size)."""
    job_ranks = {r.rank for r in ranks} | set(range(world_size or 0))
    by_stack: dict[tuple[FrameKey, ...], list[int]] = {}
    for r in ranks:
        if r.alive and r.stack is not None and r.stack.frames:
            by_stack.setdefault(_outermost_first(r.stack.frames), []).append(r.rank)
    ordered = sorted(by_stack.items(), key=lambda item: (-len(item[1]), min(item[1])))
    merged, rest = ordered[:MAX_DISTINCT_STACKS], ordered[MAX_DISTINCT_STACKS:]
    roots: list[_Node] = []
    for frames, members in merged:
        _insert(roots, frames, members)
    with_stack = {rank for _, members in merged for rank in members}
    not_merged = {rank for _, members in rest for rank in members}
    return {
        "ranks": ranks_text(with_stack),
        "without_stack": ranks_text(job_ranks - with_stack - not_merged),
        "not_merged": ranks_text(not_merged),
        "roots": [node.as_dict(job_ranks) for node in roots],
    }


def _outermost_first(frames: Sequence[Frame]) -> tuple[FrameKey, ...]:
    """``frames`` (innermost first) as tree keys, outermost first, without the native frames outside
    the outermost Python frame: the interpreter's start-up (``_start``, ``Py_RunMain``, ...) says
    nothing about where a rank is, and differs between dumps, which split the tree at its root."""
    python = [i for i, f in enumerate(frames) if not f.native]
    if python:
        frames = frames[: python[-1] + 1]
    return tuple((f.where(), f.native) for f in reversed(frames[:MAX_DEPTH]))


class _Node:
    __slots__ = ("children", "frame", "native", "ranks")

    def __init__(self, frame: str, native: bool) -> None:
        self.frame = frame
        self.native = native
        self.ranks: set[int] = set()
        self.children: list[_Node] = []

    def as_dict(self, job_ranks: set[int]) -> dict[str, Any]:
        return {
            "frame": self.frame,
            "native": self.native,
            "ranks": ranks_text(self.ranks),
            "count": len(self.ranks),
            "missing": ranks_text(job_ranks - self.ranks),
            "children": [child.as_dict(job_ranks) for child in self.children],
        }


def _insert(level: list[_Node], frames: tuple[FrameKey, ...], members: list[int]) -> None:
    for frame, native in frames:
        node = next((n for n in level if n.frame == frame and n.native == native), None)
        if node is None:
            node = _Node(frame, native)
            level.append(node)
        node.ranks.update(members)
        level = node.children
