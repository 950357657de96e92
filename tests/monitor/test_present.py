"""The presentation layer's pure parts: STAT-style stack groups, rank lists."""

from __future__ import annotations

from monitor.diagnosis import Frame, RankView, Stack
from monitor.present.job_answer import ranks_text, stack_frames, stack_groups

T0 = 1_700_000_000.0
C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


def rv(rank: int, frames: list[Frame] | None, alive: bool = True) -> RankView:
    stack = None if frames is None else Stack(taken_at=T0, frames=tuple(frames))
    return RankView(rank=rank, node="n", pid=100 + rank, alive=alive, observed_at=T0, first_seen_at=T0, stack=stack)


ALL_REDUCE = [Frame("all_reduce", C10D, 2501), Frame("sync_grads", "/w/train.py", 103), Frame("<module>", "/w/train.py", 200)]
BARRIER = [Frame("barrier", C10D, 4100), Frame("save_checkpoint", "/w/train.py", 150), Frame("<module>", "/w/train.py", 210)]


def test_ranks_with_identical_stacks_group_biggest_first() -> None:
    ranks = [rv(0, BARRIER), rv(1, ALL_REDUCE), rv(2, ALL_REDUCE), rv(3, ALL_REDUCE)]
    assert stack_groups(ranks) == [
        {"ranks": [1, 2, 3], "frames": [
            "all_reduce (torch/distributed/distributed_c10d.py:2501)", "sync_grads (train.py:103)", "<module> (train.py:200)",
        ]},
        {"ranks": [0], "frames": [
            "barrier (torch/distributed/distributed_c10d.py:4100)", "save_checkpoint (train.py:150)", "<module> (train.py:210)",
        ]},
    ]


def test_ties_are_ordered_by_lowest_rank() -> None:
    groups = stack_groups([rv(3, ALL_REDUCE), rv(1, BARRIER), rv(0, ALL_REDUCE), rv(2, BARRIER)])
    assert [g["ranks"] for g in groups] == [[0, 3], [1, 2]]


def test_native_frames_are_skipped_and_only_the_innermost_frames_compared() -> None:
    native = [Frame("pthread_cond_wait", native=True), *ALL_REDUCE]
    deep_a = [Frame(f"f{i}", "/w/a.py", i) for i in range(8)] + [Frame("outer_a", "/w/a.py", 99)]
    deep_b = [Frame(f"f{i}", "/w/a.py", i) for i in range(8)] + [Frame("outer_b", "/w/b.py", 99)]
    groups = stack_groups([rv(0, ALL_REDUCE), rv(1, native), rv(2, deep_a), rv(3, deep_b)])
    assert [g["ranks"] for g in groups] == [[0, 1], [2, 3]]
    assert len(groups[1]["frames"]) == 8
    assert stack_groups([rv(2, deep_a), rv(3, deep_b)], depth=9) == [
        {"ranks": [2], "frames": list(stack_frames(Stack(T0, tuple(deep_a)), 9))},
        {"ranks": [3], "frames": list(stack_frames(Stack(T0, tuple(deep_b)), 9))},
    ]


def test_ranks_without_stack_or_ended_are_left_out() -> None:
    only_native = [Frame("epoll_wait", native=True)]
    ranks = [rv(0, None), rv(1, ALL_REDUCE, alive=False), rv(2, only_native), rv(3, [])]
    assert stack_groups(ranks) == []
    assert stack_groups([]) == []


def test_ranks_text_collapses_runs() -> None:
    assert ranks_text([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7,8"
    assert ranks_text([4, 2, 3, 2]) == "2-4"
    assert ranks_text([9]) == "9"
    assert ranks_text([]) == ""
