"""Ranks grouped by what they share (a stack's outline, its innermost frames), at 10,000 ranks a
refresh.

The keys are tuples of dozens of frames: hashing one per rank per answer was most of the cost of
a giant job's stack tree. Ranks with the same stack content share one key object (made once per
distinct dump content, ``monitor.diagnosis.stacks.memo``), so ranks are grouped by the key's
identity first, a cheap lookup, and only the few distinct objects are then compared by value
(two equal keys may still be two objects, after the memo was cleared).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def group_ranks(keyed: Iterable[tuple[K, int]]) -> dict[K, list[int]]:
    """``{key: ranks}`` for ``(key, rank)`` pairs, ranks in the order given."""
    by_object: dict[int, tuple[K, list[int]]] = {}
    for key, rank in keyed:
        entry = by_object.get(id(key))
        if entry is None:
            # The entry holds the key, so its id cannot be reused by another object meanwhile.
            by_object[id(key)] = (key, [rank])
        else:
            entry[1].append(rank)
    groups: dict[K, list[int]] = {}
    for key, ranks in by_object.values():
        if key in groups:
            groups[key] = sorted(groups[key] + ranks)
        else:
            groups[key] = ranks
    return groups
