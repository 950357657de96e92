"""``hangwatch status`` as an aligned table: one row per job, from ``/diagnose?format=json`` jobs.

Pure formatting, tested on dicts. Every string from the monitored processes (job ids, node
names) goes through ``one_line`` before it is measured, so the table holds no control
character and its width is what the terminal shows. Widths are terminal cells (rich.cells: a
CJK character takes two); a value wider than its column's cap is cut with an ellipsis, so one
long job id never pushes the other columns out of line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len, set_cell_size

from hangwatch_common.safe_text import one_line
from monitor.present.rank_ranges import ranks_text

ELLIPSIS = "…"
GAP = "  "
# The culprits cell names each culprit's node up to this many nodes and ranks, else the ranks alone.
CULPRIT_NODES_NAMED = 3
CULPRIT_RANKS_NAMED = 8


@dataclass(frozen=True)
class Column:
    title: str
    cap: int  # widest the column gets, in terminal cells


JOB = Column("JOB", 56)
NAME = Column("NAME", 40)  # what people call it (Slurm job, pod): only when some job has one
VERDICT = Column("VERDICT", 15)
SINCE = Column("SINCE", 6)
CULPRITS = Column("CULPRITS", 32)
RANKS = Column("RANKS", 11)
NODES = Column("NODES", 5)
PROGRESS = Column("LAST PROGRESS", 24)
MONITOR = Column("MONITOR", 32)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells, the cut marked with an ellipsis."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1).rstrip() + ELLIPSIS


def pad(text: str, width: int) -> str:
    return text + " " * max(0, width - cell_len(text))


def age(seconds: float | None) -> str:
    """A short duration: 45s, 12m, 3h, 2d."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def culprits_cell(job: dict[str, Any]) -> str:
    """The culprit ranks with their nodes, grouped by node: ``1,3@node-b 5@node-c``; past a few nodes
    or ranks, ``ranks 0-4,6-1999 (1999)``: the rest is in ``hangwatch diagnose``."""
    culprits = job.get("culprit_ranks", [])
    node_of = {r.get("rank"): r.get("node") for r in job.get("ranks", [])}
    by_node: dict[str, list[str]] = {}
    for rank in culprits:
        by_node.setdefault(str(node_of.get(rank) or "?"), []).append(str(rank))
    if len(by_node) > CULPRIT_NODES_NAMED or len(culprits) > CULPRIT_RANKS_NAMED:
        return f"ranks {ranks_text(culprits)} ({len(set(culprits))})"
    return " ".join(f"{','.join(ranks)}@{node}" for node, ranks in by_node.items()) or "-"


def ranks_cell(job: dict[str, Any]) -> str:
    """Ranks reporting out of the world size (``ranks_total``: a giant job's answer lists only some)."""
    seen = job.get("ranks_total", len(job.get("ranks", [])))
    world = job.get("world_size")
    return f"{seen}/{world}" if world else str(seen)


def progress_cell(job: dict[str, Any], now: float) -> str:
    """The job's step and how long ago any rank last made progress."""
    step, last = job.get("job_step"), job.get("last_progress_at")
    if last is None:
        return "-" if step is None else f"step {step}"
    ago = f"{age(now - last)} ago"
    return ago if step is None else f"step {step}, {ago}"


def display_name(job: dict[str, Any]) -> str | None:
    names = job.get("names")
    display = names.get("display") if isinstance(names, dict) else None
    return str(display) if display else None


def job_cells(job: dict[str, Any], monitor: str | None = None, named: bool = False) -> list[str]:
    """One row's cells, escaped, in column order (NAME only when ``named``, MONITOR only when
    ``monitor`` is given)."""
    now = job.get("now") or time.time()  # the monitor's clock: ages do not depend on ours
    since = job.get("since")
    cells = [job.get("job_id", "?"), *([display_name(job) or "-"] if named else []), str(job.get("verdict", "?")).upper(),
             age(now - since) if since is not None else "-", culprits_cell(job), ranks_cell(job),
             str(len(job.get("nodes", []))), progress_cell(job, now)]
    if monitor is not None:
        cells.append(monitor)
    return [one_line(c) for c in cells]


def render_table(jobs: Sequence[tuple[dict[str, Any], str | None]],
                 paint: Callable[[str, str], str] = lambda text, verdict: text) -> str:
    """The table for ``(job, monitor)`` pairs (monitor None: no MONITOR column), header first.

    ``paint(padded_text, verdict)`` colours the verdict cell after it is padded, so the colour
    codes take no width.
    """
    with_monitor = any(monitor is not None for _, monitor in jobs)
    named = any(display_name(job) for job, _ in jobs)
    columns = [JOB, *([NAME] if named else []), VERDICT, SINCE, CULPRITS, RANKS, NODES, PROGRESS] + (
        [MONITOR] if with_monitor else [])
    rows = [[fit(c, col.cap) for c, col in zip(job_cells(job, (monitor or "") if with_monitor else None, named),
                                               columns, strict=True)]
            for job, monitor in jobs]
    widths = [max([cell_len(col.title)] + [cell_len(row[i]) for row in rows]) for i, col in enumerate(columns)]
    lines = [GAP.join(pad(col.title, w) for col, w in zip(columns, widths, strict=True)).rstrip()]
    verdict_at = columns.index(VERDICT)
    for (job, _), row in zip(jobs, rows, strict=True):
        cells = [pad(c, w) for c, w in zip(row, widths, strict=True)]
        cells[verdict_at] = paint(cells[verdict_at], str(job.get("verdict", "")))
        lines.append(GAP.join(cells).rstrip())
    return "\n".join(lines) + "\n"
