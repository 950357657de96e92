"""Lists of node names as people read them at any size: ``node[00000-00499]`` (Slurm's hostlist
notation), a count, and the first few groups, never 12,500 names on one line.

A name ending in a number (``gpu-a017``, ``node9``) is grouped with the names that differ from it
only in that number, written with the same number of digits; consecutive numbers become a range.
Any other name stays as it is. Nothing here assumes a naming scheme: names with no number, or
numbers that do not run, come out one by one, still counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Up to this many names are listed as they are, one by one.
NAMES_LISTED = 3
# Past that, this many groups (``node[0-99]`` or a lone name) are shown, then "…".
GROUPS_SHOWN = 4
# In a group, this many runs of numbers at most (``node[0-3,7,9-12,…]``): the text stays short
# whatever the names.
RUNS_SHOWN = 4

_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def hostlist(names: Iterable[str], runs_shown: int | None = None) -> list[str]:
    """The names as groups: ``["node[00000-00003,00007]", "login"]``, in the order of each group's
    first name (sorted); past ``runs_shown`` runs in a group, the rest is written "…"."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    order: list[tuple[str, str, int] | str] = []
    for name in sorted(set(names)):
        m = _NUMBERED.match(name)
        if not m:
            order.append(name)
            continue
        prefix, digits, suffix = m.groups()
        key = (prefix, suffix, len(digits))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, suffix, width = item
        runs = _runs(groups[item])
        if len(runs) == 1 and runs[0][0] == runs[0][1]:
            out.append(f"{prefix}{runs[0][0]:0{width}d}{suffix}")
            continue
        kept = runs if runs_shown is None else runs[:runs_shown]
        spans = ",".join(f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in kept)
        spans += ",…" if len(kept) < len(runs) else ""
        out.append(f"{prefix}[{spans}]{suffix}")
    return out


def nodes_text(names: Iterable[str], groups_shown: int = GROUPS_SHOWN) -> str:
    """``vm1, vm2`` for a few names; ``500 nodes: node[00000-00499]`` or ``12 nodes: a, b[1-3], c, d, …``
    for more: a count, then the first groups."""
    unique = sorted(set(names))
    if len(unique) <= NAMES_LISTED:
        return ", ".join(unique)
    groups = hostlist(unique, RUNS_SHOWN)
    shown = ", ".join(groups[:groups_shown]) + (", …" if len(groups) > groups_shown else "")
    return f"{len(unique)} nodes: {shown}"


def numbers_text(numbers: Iterable[int], runs_shown: int = 2 * RUNS_SHOWN) -> str:
    """``0-3, 7, 9-12`` (node ranks, say); past ``runs_shown`` runs, "… (N in all)"."""
    unique = sorted(set(numbers))
    runs = _runs(unique)
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:runs_shown])
    return text + (f", … ({len(unique)} in all)" if len(runs) > runs_shown else "")
