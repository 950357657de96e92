"""monitor.present.grouping: ranks grouped by equal keys, by the keys' identity first."""

from __future__ import annotations

from monitor.present.grouping import group_ranks


def test_ranks_sharing_one_key_object_form_one_group_in_the_order_given() -> None:
    waiting, lingering = ("all_reduce", "train_step"), ("main",)
    keyed = [(waiting, 0), (lingering, 5), (waiting, 1), (waiting, 9)]
    assert group_ranks(keyed) == {waiting: [0, 1, 9], lingering: [5]}


def test_equal_keys_that_are_different_objects_still_form_one_group() -> None:
    # Two dumps of the same frames made after the memo was cleared: equal tuples, two objects.
    first = tuple(["all_reduce", "train_step"])
    second = tuple(["all_reduce", "train_step"][i] for i in range(2))
    assert first == second and first is not second
    groups = group_ranks([(first, 4), (second, 1), (first, 7)])
    assert groups == {first: [1, 4, 7]}


def test_no_ranks_no_groups() -> None:
    assert group_ranks([]) == {}
