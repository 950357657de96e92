"""Node names as people read them at any size (hangwatch_common/name_lists.py), table-style."""

from __future__ import annotations

import pytest

from hangwatch_common.name_lists import hostlist, nodes_text, numbers_text

NODES_500 = [f"node{i:05d}" for i in range(500)]


@pytest.mark.parametrize(("names", "groups"), [
    (["node3", "node1", "node2"], ["node[1-3]"]),
    (["node01", "node02", "node04", "node05", "node06"], ["node[01-02,04-06]"]),
    (["gpu-a7"], ["gpu-a7"]),
    (["login", "node1", "node2"], ["login", "node[1-2]"]),
    (["n1.cluster", "n2.cluster"], ["n[1-2].cluster"]),
    # Only the same width groups: node9 and node10 are written as they are, not as node[9-10].
    (["node9", "node10"], ["node10", "node9"]),
    (["a", "a"], ["a"]),
])
def test_hostlist_groups_names_that_differ_in_their_number(names: list[str], groups: list[str]) -> None:
    assert hostlist(names) == groups


@pytest.mark.parametrize(("names", "text"), [
    ([], ""),
    (["vm"], "vm"),
    (["b", "a", "c"], "a, b, c"),
    (NODES_500, "500 nodes: node[00000-00499]"),
    ([f"node{i:05d}" for i in range(0, 12_500, 2)], "6250 nodes: node[00000,00002,00004,00006,…]"),
    (["a1", "b", "c", "d", "e", "f"], "6 nodes: a1, b, c, d, …"),
    (["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"], "4 nodes: rack1-n[1-2], rack2-n[1-2]"),
])
def test_nodes_text_is_a_count_and_the_first_groups(names: list[str], text: str) -> None:
    assert nodes_text(names) == text


def test_nodes_text_stays_short_whatever_the_names() -> None:
    scattered = [f"host-{i * 7919 % 100_003}" for i in range(12_500)]
    assert len(nodes_text(scattered)) < 200
    assert nodes_text(scattered).startswith("12500 nodes: ")


@pytest.mark.parametrize(("numbers", "text"), [
    ([3], "3"),
    ([0, 1, 2, 3, 7, 9, 10], "0-3, 7, 9-10"),
    (range(0, 40, 2), "0, 2, 4, 6, 8, 10, 12, 14, … (20 in all)"),
])
def test_numbers_text(numbers: list[int], text: str) -> None:
    assert numbers_text(numbers) == text
