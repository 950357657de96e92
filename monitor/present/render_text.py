"""``GET /diagnose`` for a person at a terminal: one block per job, a table of ranks.

Strings from the monitored processes (job ids, frames, command lines, log lines in the
evidence) go in through ``one_line``: no control character reaches the terminal, and none
can start a line of its own.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from hangwatch_common.name_lists import nodes_text
from hangwatch_common.safe_text import one_line
from monitor.present.job_answer import ranks_text

# A giant job has a launcher per node: this many are listed, the rest counted by kind (at most
# LAUNCHER_KINDS_LISTED lines of them).
LAUNCHERS_LISTED = 8
LAUNCHER_KINDS_LISTED = 3


def render_text(jobs: list[dict[str, Any]], now: float) -> str:
    if not jobs:
        return "hangwatch: no jobs reported yet\n"
    return "\n".join(render_job(job, now) for job in jobs)


def render_monitor_status(status: dict[str, Any]) -> str:
    """First lines about the monitor itself, only while it is past capacity or cannot store."""
    lines = []
    if status.get("storage_problem"):
        lines.append(f"hangwatch: the database is not taking writes ({one_line(status['storage_problem'])}): "
                     "history is held in memory and will not survive a restart")
    if status.get("overloaded") or status.get("reports_shed_last_minute"):
        age = status.get("verdicts_age_s")
        aged = f"; verdicts from a pass {age:.1f}s ago" if age is not None else ""
        lines.append(f"hangwatch: monitor over capacity (event loop {status['loop_lag_s']:.2f}s behind): "
                     f"{status['reports_shed_last_minute']} reports shed in the last minute{aged}")
    return "".join(f"{line}\n" for line in lines) + ("\n" if lines else "")


def render_job(job: dict[str, Any], now: float) -> str:
    since = ""
    if job["since"] is not None:
        since = f"  since {_ago(now - job['since'])} ({_clock(job['since'])})"
    lines = [f"JOB {one_line(job['job_id'])}  {one_line(job['verdict'].upper())}{since}",
             f"  {one_line(job['summary'])}"]
    culprits = job["culprit_ranks"]
    if culprits:
        lines.append(f"  culprits: {_ranks_word(culprits)} (marked * below)")
    nodes = one_line(nodes_text(job.get("nodes", [])))
    total = job.get("ranks_total", len(job["ranks"]))
    if total:
        lines.append(f"  world size {job['world_size']}, {total} ranks seen" + (f" on {nodes}" if nodes else ""))
    else:  # a launcher alone: no world size is known yet (the ranks carry it)
        expected = f", world size {job['world_size']} by its launcher's options" if job["world_size"] > 1 else ""
        lines.append(f"  no rank seen yet{expected}" + (f"; the launcher runs on {nodes}" if nodes else ""))
    display = (job.get("names") or {}).get("display")
    if display:
        lines.append(f"  known as {one_line(display)}")
    if job.get("aliases"):
        lines.append(f"  also reported as {one_line(', '.join(job['aliases']))} "
                     "(another spelling of the master address)")
    if job.get("stacks_unavailable_reason"):
        lines.append(f"  stacks unavailable: {one_line(job['stacks_unavailable_reason'])}")
    lost = _lost_line(job.get("lost") or {})
    if lost:
        lines.append(f"  {lost}")
    found = _found_by(job["ranks"])
    if found:
        lines.append(f"  ranks found by {found}")
    _section(lines, "evidence", [f"- {one_line(e)}" for e in job["evidence"]])
    _section(lines, "hints", [f"> {one_line(h)}" for h in job["hints"]])
    _section(lines, "waiting at",
             [f"{_ranks_word(g['ranks'])}: {one_line(g['site'])}" for g in job.get("groups") or []])
    _section(lines, "stacks (innermost first)",
             [f"{_ranks_word(g['ranks'])}: {one_line(' ← '.join(g['frames']))}"
              for g in job.get("stack_groups") or []])
    _section(lines, "launchers", _launcher_lines(job.get("launchers") or []))
    _section(lines, "leftover processes (parent gone)", [_orphan_line(o) for o in job.get("orphans") or []])
    _section(lines, "ranks claimed by another node (ignored)", [
        f"rank {c['rank']}: claimed by {one_line(c['claimed_by'])}, "
        f"{one_line(c.get('reason') or 'run by ' + c['held_by'])} ({c['refused']} reports refused)"
        for c in job.get("rank_conflicts") or []])
    lines.append("")
    if job["ranks"]:
        lines.extend("  " + row for row in _rank_table(job["ranks"], set(culprits)))
        unlisted = job.get("ranks_total", len(job["ranks"])) - len(job["ranks"])
        if unlisted > 0:
            lines.append(f"  ... {unlisted} more ranks not listed (ranks_offset= and ranks_limit= page through them)")
    else:
        lines.append("  no rank has started yet")
    lines.append("")
    return "\n".join(lines)


def _lost_line(lost: dict[str, Any]) -> str | None:
    from monitor.engine.hang_cost import JobCost, lost_text

    return lost_text(JobCost(rank_seconds=dict(lost.get("rank_seconds") or {}),
                             gpu_seconds=dict(lost.get("gpu_seconds") or {})))


def _found_by(ranks: list[dict[str, Any]]) -> str:
    """"lightning:parent-of-LOCAL_RANK-children (rank 0), lightning:LOCAL_RANK (rank 1)"."""
    by_how: dict[str, list[int]] = {}
    for r in ranks:
        if r.get("identified_by"):
            by_how.setdefault(r["identified_by"], []).append(r["rank"])
    ordered = sorted(by_how.items(), key=lambda i: min(i[1]))
    return ", ".join(f"{one_line(how)} ({_ranks_word(rs)})" for how, rs in ordered)


def _ranks_word(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {ranks_text(ranks)}"


def _launcher_lines(launchers: list[dict[str, Any]]) -> list[str]:
    """A line per launcher for a few; for a giant job (a torchrun per node) the unusual ones (ended, or
    another number of workers than most) and the first few, then the rest counted by kind."""
    if len(launchers) <= LAUNCHERS_LISTED:
        return [_launcher_line(launcher) for launcher in launchers]

    def kind(launcher: dict[str, Any]) -> tuple[bool, int]:
        return bool(launcher["alive"]), launcher["worker_count"]

    usual = Counter(kind(launcher) for launcher in launchers).most_common(1)[0][0]
    ordered = sorted(launchers, key=lambda launcher: kind(launcher) == usual)  # stable: the unusual first
    rest: dict[tuple[bool, int], list[str]] = {}
    for launcher in ordered[LAUNCHERS_LISTED:]:
        rest.setdefault(kind(launcher), []).append(launcher["node"])
    lines = [_launcher_line(launcher) for launcher in ordered[:LAUNCHERS_LISTED]]
    kinds = sorted(rest.items(), key=lambda item: -len(item[1]))
    for (alive, workers), nodes in kinds[:LAUNCHER_KINDS_LISTED]:
        lines.append(f"... {len(nodes)} more, {'alive' if alive else 'ended'}, {workers} workers each, "
                     f"on {one_line(nodes_text(nodes))}")
    left = sum(len(nodes) for _, nodes in kinds[LAUNCHER_KINDS_LISTED:])
    if left:
        lines.append(f"... {left} more of other kinds")
    return lines


def _launcher_line(launcher: dict[str, Any]) -> str:
    parts = [f"{one_line(launcher['node'])} pid {launcher['pid']}"]
    if launcher.get("node_rank") is not None or launcher.get("nnodes"):
        parts.append(f"node {_opt(launcher.get('node_rank'))} of {_opt(launcher.get('nnodes') or '?')}")
    parts.append(f"{launcher['worker_count']} workers")
    parts.append("alive" if launcher["alive"] else "ended")
    if launcher.get("top_frame"):
        parts.append(f"at {one_line(launcher['top_frame'])}")
    return ", ".join(parts)


def _orphan_line(orphan: dict[str, Any]) -> str:
    ports = orphan.get("listening_ports") or []
    listening = f" (listening on {', '.join(str(p) for p in ports)})" if ports else ""
    return f"{one_line(orphan['node'])} pid {orphan['pid']}{listening}: {one_line(orphan['cmdline'])}"


def _rank_table(ranks: list[dict[str, Any]], culprits: set[int]) -> list[str]:
    header = ("RANK", "NODE", "PID", "STATE", "CPU%", "WAIT%", "STEP", "NO PROGRESS", "TOP FRAME")
    rows = [
        (
            f"{r['rank']}*" if r["rank"] in culprits else str(r["rank"]),
            one_line(r["node"]),
            _opt(r["pid"]),
            one_line(r["state"]),
            f"{r['cpu_percent']:.0f}" if r["cpu_percent"] is not None else "-",
            f"{100 * r['collective_wait_share']:.0f}" if r.get("collective_wait_share") is not None else "-",
            _opt(r["step"]),
            _ago(r["seconds_since_progress"]) if r["seconds_since_progress"] is not None else "-",
            one_line(r["top_frame"] or "-"),
        )
        for r in ranks
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    out = []
    for row in [header, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths)]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    return out


def _opt(value: object) -> str:
    return "-" if value is None else one_line(str(value))


def _clock(t: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return "?"  # a time no calendar holds (an agent's clock or report gone wrong)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def _section(lines: list[str], title: str, items: list[str]) -> None:
    """A titled, indented list; nothing at all when it is empty."""
    if items:
        lines.append(f"  {title}:")
        lines.extend(f"    {item}" for item in items)
