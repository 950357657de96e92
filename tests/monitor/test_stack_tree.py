"""The merged stack tree (monitor/present/stack_tree.py): who is at each frame, and who is missing."""

from __future__ import annotations

from typing import Any

from monitor.diagnosis import Frame, RankView, Stack
from monitor.present.stack_tree import MAX_DISTINCT_STACKS, stack_tree

T0 = 1_700_000_000.0
C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
NATIVE_WAIT = [Frame("pthread_cond_wait", native=True), Frame("c10d::Work::wait", native=True)]
ALL_REDUCE = [Frame("all_reduce", C10D, 2501), Frame("train_step", "/w/train.py", 50), Frame("<module>", "/w/train.py", 90)]
LINGER = [Frame("linger_forever", "/w/train.py", 12), Frame("<module>", "/w/train.py", 90)]


def rv(rank: int, frames: list[Frame] | None, alive: bool = True) -> RankView:
    stack = None if frames is None else Stack(taken_at=T0, frames=tuple(frames))
    return RankView(rank=rank, node="n", pid=100 + rank, alive=alive, observed_at=T0, first_seen_at=T0, stack=stack)


def flat(nodes: list[dict[str, Any]], depth: int = 0) -> list[tuple[int, str, bool, str, str]]:
    """The tree as (depth, frame, native, ranks, missing) rows, outermost first."""
    rows = []
    for node in nodes:
        rows.append((depth, node["frame"], node["native"], node["ranks"], node["missing"]))
        rows += flat(node["children"], depth + 1)
    return rows


def test_the_odd_rank_out_is_missing_under_the_frame_its_peers_wait_in() -> None:
    ranks = [rv(0, NATIVE_WAIT + ALL_REDUCE), rv(1, LINGER), rv(2, NATIVE_WAIT + ALL_REDUCE), rv(3, NATIVE_WAIT + ALL_REDUCE)]
    tree = stack_tree(ranks, world_size=4)
    assert flat(tree["roots"]) == [
        (0, "<module> (train.py:90)", False, "0-3", ""),
        (1, "train_step (train.py:50)", False, "0,2,3", "1"),
        (2, "all_reduce (torch/distributed/distributed_c10d.py:2501)", False, "0,2,3", "1"),
        (3, "c10d::Work::wait", True, "0,2,3", "1"),
        (4, "pthread_cond_wait", True, "0,2,3", "1"),
        (1, "linger_forever (train.py:12)", False, "1", "0,2,3"),
    ]
    assert (tree["ranks"], tree["without_stack"], tree["not_merged"]) == ("0-3", "", "")


def test_ranks_without_a_stack_or_not_yet_seen_are_listed_apart_not_missing() -> None:
    # Nobody knows where they are: calling them missing at a frame would point at them wrongly.
    tree = stack_tree([rv(0, ALL_REDUCE), rv(1, None), rv(2, ALL_REDUCE, alive=False), rv(4, LINGER)], world_size=5)
    assert tree["without_stack"] == "1-3"
    assert {(row[1], row[4]) for row in flat(tree["roots"])} >= {("<module> (train.py:90)", ""),
                                                                   ("linger_forever (train.py:12)", "0")}
    assert "1" not in {rank for row in flat(tree["roots"]) for rank in row[4].split(",")}


def test_distinct_stacks_past_the_bound_are_counted_not_merged() -> None:
    ranks = [rv(r, [Frame(f"f{r}", "/w/a.py", r), *ALL_REDUCE]) for r in range(MAX_DISTINCT_STACKS + 3)]
    tree = stack_tree(ranks, world_size=None)
    leaves = [row for row in flat(tree["roots"]) if row[1].startswith("f")]
    assert len(leaves) == MAX_DISTINCT_STACKS
    assert tree["not_merged"] == f"{MAX_DISTINCT_STACKS}-{MAX_DISTINCT_STACKS + 2}"
    assert tree["without_stack"] == ""
    # The ranks not merged may well be at the shared frames: never called missing there.
    (root,) = tree["roots"]
    assert root["missing"] == "" and root["ranks"] == f"0-{MAX_DISTINCT_STACKS - 1}"


def test_start_up_native_frames_outside_python_do_not_split_the_tree() -> None:
    start_up = [Frame("Py_RunMain", native=True), Frame("__libc_start_main", native=True), Frame("_start", native=True)]
    other_start_up = [Frame("Py_BytesMain", native=True), Frame("0x7f3a2b1c", native=True)]
    tree = stack_tree([rv(0, NATIVE_WAIT + ALL_REDUCE + start_up), rv(1, LINGER + other_start_up)], world_size=2)
    assert [(row[0], row[1], row[3]) for row in flat(tree["roots"])][:2] == [
        (0, "<module> (train.py:90)", "0,1"), (1, "train_step (train.py:50)", "0")]
    assert ("c10d::Work::wait", True) in {(row[1], row[2]) for row in flat(tree["roots"])}
