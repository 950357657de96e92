"""``hangwatch nodes``: the nodes named as culprits in incidents of the most distinct jobs within
a window (the monitor's /api/v1/nodes/suspects), from every monitor given, merged: the machines
to look at, or drain, first."""

from __future__ import annotations

from typing import Any

from hangwatch.monitor_client import Ask, MonitorFailure, Unreadable, get_from_monitor
from hangwatch_common.safe_text import one_line

SUSPECTS_PATH = "/api/v1/nodes/suspects"
# Nodes asked of each monitor: the merge ranks them again.
ASKED_LIMIT = 10_000


def fetch_suspects(monitor: str, ask: Ask, window_s: float) -> list[dict[str, Any]]:
    """One monitor's suspect nodes; raises the MonitorFailure kinds (hangwatch/monitor_client.py)."""
    r = get_from_monitor(monitor, SUSPECTS_PATH, {"window_s": window_s, "limit": ASKED_LIMIT}, ask)
    if r.status_code == 404:
        raise MonitorFailure(monitor, f"answered HTTP 404 for {SUSPECTS_PATH}: not a hangwatch monitor's base URL, "
                                      "or a monitor older than this hangwatch (upgrade it)")
    if not r.is_success:
        raise MonitorFailure(monitor, f"answered HTTP {r.status_code} {r.reason_phrase}")
    try:
        nodes = r.json()["nodes"]
        return [_checked(n) for n in nodes]
    except (ValueError, KeyError, TypeError) as e:
        raise Unreadable(monitor, f"not a suspect-nodes answer ({type(e).__name__}: {e})") from None


def _checked(node: Any) -> dict[str, Any]:
    jobs, verdicts = node["jobs"], node["verdicts"]
    if not (isinstance(node["node"], str) and isinstance(jobs, list) and isinstance(verdicts, dict)):
        raise TypeError("a node without name, jobs or verdicts")
    return {"node": node["node"], "jobs": [str(j) for j in jobs], "incidents": int(node["incidents"]),
            "verdicts": {str(v): int(c) for v, c in verdicts.items()}, "last_at": float(node["last_at"])}


def merge(answers: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Sharded monitors each know their jobs' incidents: a node's jobs and counts add up."""
    merged: dict[str, dict[str, Any]] = {}
    for nodes in answers:
        for n in nodes:
            into = merged.setdefault(n["node"], {"node": n["node"], "jobs": [], "incidents": 0, "verdicts": {},
                                                 "last_at": 0.0})
            into["jobs"] += [j for j in n["jobs"] if j not in into["jobs"]]
            into["incidents"] += n["incidents"]
            for verdict, count in n["verdicts"].items():
                into["verdicts"][verdict] = into["verdicts"].get(verdict, 0) + count
            into["last_at"] = max(into["last_at"], n["last_at"])
    return sorted(merged.values(), key=lambda n: (-len(n["jobs"]), -n["incidents"], -n["last_at"], n["node"]))


def render(nodes: list[dict[str, Any]], window_s: float, now: float) -> str:
    span = _span(window_s)
    if not nodes:
        return f"no node was named as a culprit in the last {span}\n"
    rows = [("NODE", "JOBS", "INCIDENTS", "VERDICTS", "LAST", "JOB IDS")]
    for n in nodes:
        verdicts = ", ".join(f"{v} {c}" for v, c in sorted(n["verdicts"].items(), key=lambda vc: -vc[1]))
        jobs = ", ".join(n["jobs"][:5]) + (f" (+{len(n['jobs']) - 5})" if len(n["jobs"]) > 5 else "")
        rows.append((n["node"], str(len(n["jobs"])), str(n["incidents"]), verdicts,
                     f"{_span(max(0.0, now - n['last_at']))} ago", jobs))
    rows = [tuple(one_line(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    return f"nodes named as culprits in the last {span}, most distinct jobs first:\n" + "\n".join(lines) + "\n"


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
