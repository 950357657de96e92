"""The ranks' main-thread stacks merged into one tree, outermost frame first (STAT's prefix tree).

Each node is a frame with the ranks whose stack passes through it and the merged ranks that do
not (``missing``): the odd rank out shows as the one missing under the frame its peers wait in.
Ranks with no stack, or past the bound below, are listed apart: nobody knows where they are.
Native frames (py-spy ``--native``, taken for stuck ranks) are kept and flagged so the page can
fold them, except the interpreter's start-up frames outside the outermost Python frame
(``Stack.outline``). Rank sets are written as ranges (``0-6,8``), so a node costs the same at
10,000 ranks.

Bounded: at most ``MAX_DEPTH`` innermost frames of a stack (where a rank waits is innermost; the
outer frames are the common ``<module>``/``main`` prefix), and at most ``MAX_DISTINCT_STACKS``
distinct stacks merged, the most common first; ranks of the rest are listed as ``not_merged``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.diagnosis import RankView, Stack
from monitor.diagnosis.stacks import memo
from monitor.present.grouping import group_ranks
from monitor.present.rank_ranges import ranks_text

MAX_DEPTH = 96
MAX_DISTINCT_STACKS = 64

FrameKey = tuple[str, bool]


def stack_tree(ranks: Sequence[RankView], world_size: int | None) -> dict[str, Any]:
    """The merged tree of the live ranks' stacks; ranks are the job's (seen or within its world size).

    ``missing`` at a frame counts only the merged ranks: a rank without a stack, or one of the
    stacks past ``MAX_DISTINCT_STACKS``, is listed apart, never as missing where it may well be.
    """
    job_ranks = {r.rank for r in ranks} | set(range(world_size or 0))
    # The outline is made once per distinct dump content, and ranks grouped by it without hashing
    # it again (monitor.present.grouping): a refresh costs a lookup per rank.
    by_stack = group_ranks((_outline(r.stack), r.rank) for r in ranks
                           if r.alive and r.stack is not None and r.stack.frames)
    ordered = sorted(by_stack.items(), key=lambda item: (-len(item[1]), min(item[1])))
    merged, rest = ordered[:MAX_DISTINCT_STACKS], ordered[MAX_DISTINCT_STACKS:]
    roots: list[_Node] = []
    for group, (frames, _) in enumerate(merged):
        _insert(roots, frames, group)
    with_stack = {rank for _, members in merged for rank in members}
    not_merged = {rank for _, members in rest for rank in members}
    sets = _RankSets([members for _, members in merged], with_stack)
    return {
        "ranks": ranks_text(with_stack),
        "without_stack": ranks_text(job_ranks - with_stack - not_merged),
        "not_merged": ranks_text(not_merged),
        "roots": [node.as_dict(sets) for node in roots],
    }


def _outline(stack: Stack) -> tuple[FrameKey, ...]:
    def make() -> tuple[FrameKey, ...]:
        outline = stack.outline
        return outline if len(outline) <= MAX_DEPTH else outline[-MAX_DEPTH:]

    return memo(stack, "tree_outline", make)


class _RankSets:
    """A node's ranks as text, made once per distinct set of stacks: a chain of frames shares
    one set, so a tree of thousands of frames needs only a few of these unions."""

    def __init__(self, groups: list[list[int]], merged: set[int]) -> None:
        self.groups = groups
        self.merged = merged
        self._made: dict[frozenset[int], tuple[str, int, str]] = {}

    def of(self, groups: frozenset[int]) -> tuple[str, int, str]:
        made = self._made.get(groups)
        if made is None:
            ranks = {rank for g in groups for rank in self.groups[g]}
            made = self._made[groups] = (ranks_text(ranks), len(ranks), ranks_text(self.merged - ranks))
        return made


class _Node:
    __slots__ = ("children", "frame", "groups", "native")

    def __init__(self, frame: str, native: bool) -> None:
        self.frame = frame
        self.native = native
        self.groups: set[int] = set()  # indexes of the merged stacks through this frame
        self.children: list[_Node] = []

    def as_dict(self, sets: _RankSets) -> dict[str, Any]:
        ranks, count, missing = sets.of(frozenset(self.groups))
        return {
            "frame": self.frame,
            "native": self.native,
            "ranks": ranks,
            "count": count,
            "missing": missing,
            "children": [child.as_dict(sets) for child in self.children],
        }


def _insert(level: list[_Node], frames: tuple[FrameKey, ...], group: int) -> None:
    for frame, native in frames:
        node = next((n for n in level if n.frame == frame and n.native == native), None)
        if node is None:
            node = _Node(frame, native)
            level.append(node)
        node.groups.add(group)
        level = node.children
