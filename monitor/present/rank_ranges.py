"""Rank sets as people read them: ``0-3,5,7,8``."""

from __future__ import annotations

from collections.abc import Iterable


def ranks_text(ranks: Iterable[int]) -> str:
    """``0-3,5,7,8``: three or more consecutive ranks as a range."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j == i:
            parts.append(str(ordered[i]))
        elif j == i + 1:
            parts.append(f"{ordered[i]},{ordered[j]}")
        else:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
