"""A node's reports in the order its agent sent them: a stale, repeated or forged number is refused.

Each agent numbers the reports it sends to a monitor (``seq``: 1, 2, 3, ... for one run of the
agent, which its ``agent.started_at`` and ``agent.pid`` name). A report body captured on the way
and posted again, with the node's own token, used to be taken as news: alternating two old
bodies kept a real deadlock ``healthy`` for 25 s. Now a report is refused (409, counted as
``stale``) when:
  - its run of the agent is the node's current one and its number is not above the last taken,
    or so far above it that the agent cannot have sent that many since (``MAX_SEQ_AHEAD`` plus
    ``SEQ_AHEAD_PER_S`` a second): one body numbered 10^15 used to lock the real agent out;
  - it has no number while the node's agent numbers its reports (a captured body with ``seq``
    taken out used to pass as one from an agent too old to number);
  - it comes from a run the node has since replaced (a run never comes back), from a run older
    than the current one while the current one still reports, or from one that says it starts in
    the future (by the node's clock as its reports showed it) while the current one still reports.
An agent answered 409 starts a new run by itself (agent/sender.py), numbered from 1, and is
taken; so is a run never seen with an older start (a node whose clock went back over a reboot)
once the current run has been silent ``CURRENT_RUN_SILENT_S``. Agents from before numbering
send no number, and are taken as before until their node's agent numbers.

Pure: the caller passes what it knows of the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


# A run of the agent older than the node's current one is taken once the current one has been
# silent this long: the node rebooted with its clock behind, and its new agent must be heard.
CURRENT_RUN_SILENT_S = 30.0
# How far a number may run ahead of the last taken: the agent numbers every post it tries (one a
# second, more while it delivers what it kept through an outage), so a gap grows with the time
# since, but never to 10^15.
MAX_SEQ_AHEAD = 1000
SEQ_AHEAD_PER_S = 20.0
# A new run that says it started later than this past now, by the node's clock as the monitor
# knows it, is not taken while the current run reports: a forged run dated ahead would otherwise
# make the real agent's every new run older than it, and refused.
FUTURE_START_S = 5.0
# Runs of the agent a node replaced, remembered so that none is taken again.
PAST_RUNS_KEPT = 16

Run = tuple[float | None, int | None]  # (agent.started_at, agent.pid)


@dataclass(frozen=True)
class LastTaken:
    """What the monitor took last from a node: its agent's run, the report's number, when."""

    started_at: float | None
    pid: int | None
    seq: int | None
    received_at: float = 0.0
    past_runs: tuple[Run, ...] = ()  # oldest first
    offset: float = 0.0  # the node's clock offset then (monitor time - the node's)


def stale_reason(report: Any, last: LastTaken | None, now: float) -> str | None:
    """Why ``report`` is stale (None: it is news)."""
    if last is None:
        return None
    seq = getattr(report, "seq", None)
    agent = report.agent
    run = (agent.started_at, agent.pid)
    if seq is None:
        if last.seq is not None:
            return ("an unnumbered report, while this node's agent numbers its reports (a captured report with its "
                    "number taken out)")
        return None
    if run == (last.started_at, last.pid):
        if last.seq is None:
            return None
        if seq <= last.seq:
            return (f"report {seq} of this agent's run is not newer than report {last.seq}, already taken "
                    "(a repeated or replayed report)")
        ahead = MAX_SEQ_AHEAD + SEQ_AHEAD_PER_S * max(0.0, now - last.received_at)
        if seq - last.seq > ahead:
            return (f"report {seq} is {seq - last.seq} ahead of report {last.seq}, taken {now - last.received_at:.0f}s "
                    "ago: more than the agent can have sent since (a forged number)")
        return None
    if run in last.past_runs:
        return "report from a run of the agent this node has since replaced (a replayed report)"
    current_reports = now - last.received_at < CURRENT_RUN_SILENT_S
    if agent.started_at is not None and agent.started_at + last.offset > now + FUTURE_START_S and current_reports:
        return (f"report from a run of the agent that starts {agent.started_at + last.offset - now:.0f}s from now by "
                "this node's clock: a forged run")
    if (agent.started_at is not None and last.started_at is not None and agent.started_at < last.started_at
            and current_reports):
        return (f"report from a run of the agent started at {agent.started_at:.0f}, before the node's current "
                f"one ({last.started_at:.0f}): a replayed report")
    return None


def runs_replaced(last: LastTaken | None, report: Any) -> tuple[Run, ...]:
    """The node's past runs once ``report`` (taken) is its current one."""
    if last is None:
        return ()
    run = (report.agent.started_at, report.agent.pid)
    current = (last.started_at, last.pid)
    if run == current:
        return last.past_runs
    return (*last.past_runs, current)[-PAST_RUNS_KEPT:]
