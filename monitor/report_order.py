"""A node's reports in the order its agent sent them: a stale or repeated report is refused.

Each agent numbers the reports it sends to a monitor (``seq``: 1, 2, 3, ... for one run of the
agent, which its ``agent.started_at`` and ``agent.pid`` name). A report body captured on the way
and posted again, with the node's own token, used to be taken as news: alternating two old
bodies kept a real deadlock ``healthy`` for 25 s. Now a report is refused (409, counted as
``stale``) when its run of the agent is the node's current one and its number is not above the
last taken, or when it comes from a run older than the current one while the current one still
reports. A restarted agent starts a new run, numbered from 1, and is taken; so is a run with an
older start (a node whose clock went back over a reboot) once the current run has been silent
``CURRENT_RUN_SILENT_S``. Reports without a number (agents from before) are taken as before.

Pure: the caller passes what it knows of the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


# A run of the agent older than the node's current one is taken once the current one has been
# silent this long: the node rebooted with its clock behind, and its new agent must be heard.
CURRENT_RUN_SILENT_S = 30.0


@dataclass(frozen=True)
class LastTaken:
    """What the monitor took last from a node: its agent's run, the report's number, when."""

    started_at: float | None
    pid: int | None
    seq: int | None
    received_at: float = 0.0


def stale_reason(report: Any, last: LastTaken | None, now: float) -> str | None:
    """Why ``report`` is stale (None: it is news)."""
    seq = getattr(report, "seq", None)
    if last is None or seq is None:
        return None
    agent = report.agent
    same_run = (agent.started_at, agent.pid) == (last.started_at, last.pid)
    if same_run:
        if last.seq is not None and seq <= last.seq:
            return (f"report {seq} of this agent's run is not newer than report {last.seq}, already taken "
                    "(a repeated or replayed report)")
        return None
    if (agent.started_at is not None and last.started_at is not None and agent.started_at < last.started_at
            and now - last.received_at < CURRENT_RUN_SILENT_S):
        return (f"report from a run of the agent started at {agent.started_at:.0f}, before the node's current "
                f"one ({last.started_at:.0f}): a replayed report")
    return None
