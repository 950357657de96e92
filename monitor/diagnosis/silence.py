"""A node whose agent went silent: its ranks are unknown, and the job's verdict with them.

What the monitor holds of a silent node's ranks is its last report: a rank busy in it looks
busy forever, one idle in it idle forever. Read as live, that made a healthy job turn
``slow_compute`` within seconds of its agent stopping, long enough to page. So the ranks of
a silent node are never evidence: the job is ``unknown`` until the node reports again, unless
a fact from the nodes still reporting (a rank that exited or was stopped there) explains it.
Right after a monitor restart every node is "silent" until its first fresh report: that is
said as such, not as a lost agent. So is a job known before the restart whose ranks are not all
heard yet: a node whose stored snapshots did not hold the job (taken before it started there)
holds ranks the monitor cannot know of until its agent reports; judged from the ranks heard, a
deadlocked job read "healthy" (tests/e2e/test_restart_herd.py).
"""

from __future__ import annotations

from hangwatch_common.name_lists import nodes_text
from monitor.diagnosis.context import Context, ranks_text
from monitor.diagnosis.model import Diagnosis

# A node whose latest report is this recent and still not the present is being refreshed.
REFRESHING_S = 10.0
# A line of evidence each for this many silent nodes at most; the rest are counted.
NODE_LINES = 8
# For this long after a restart a job known before it, with ranks not heard yet, is refreshing (its
# nodes' full reports come within seconds, monitor/ingest/full_pacing.py: 10 s at most); then the
# rules that read missing ranks (rendezvous) judge it.
REBUILD_S = 30.0


def replays_arriving(ctx: Context) -> Diagnosis | None:
    """Judged at the present while a node of the job has sent only reports its agent kept through an
    outage: the picture is the past, part rebuilt. What it shows (a rank's exit, a healthy job that
    has since died) belongs in the history at its own time, where each replayed report is judged;
    read now it would be recorded now, and the replays could no longer record it when it happened.
    The present is known with the node's first live report, which follows the replays at once."""
    behind = [(node, at) for node, at in ctx.job.replaying_nodes if ctx.now > at]
    if not behind:
        return None
    nodes = nodes_text(node for node, _ in behind)
    evidence = _first_lines([f"node {node}: latest report kept through an outage, taken {ctx.now - at:.0f}s ago; "
                             "no live report since" for node, at in behind])
    return ctx.diagnosis("unknown", (), None, f"refreshing: the agent on {nodes} is delivering what it kept "
                         "through an outage", evidence)


def agents_silent(ctx: Context) -> Diagnosis | None:
    silent = dict(ctx.job.silent_nodes)
    if not silent:
        return _ranks_unheard_since_restart(ctx)
    unknown = sorted(a.rank.rank for a in ctx.live() if a.rank.node in silent)
    launchers = [lv for lv in ctx.job.launchers if lv.alive and lv.node in silent]
    if not unknown and not launchers:
        return None
    started = ctx.job.monitor_started_at
    refreshing = [n for n, last in silent.items() if _refreshing(last, started, ctx.now)]
    evidence = _first_lines([_silence_line(n, last, started, ctx.now) for n, last in sorted(silent.items())])
    here = "these nodes" if len(silent) > 1 else "it"
    if unknown:
        evidence.append(f"{ranks_text(unknown)} on {here}: state unknown")
    if launchers:
        evidence.append(f"launcher{'s' if len(launchers) > 1 else ''} on {here}: "
                        f"{', '.join(f'pid {lv.pid}' for lv in launchers)}, state unknown")
    what = ranks_text(unknown) if unknown else "its launcher"
    nodes = nodes_text(silent)
    if refreshing and len(refreshing) == len(silent) and started is not None:
        summary = (f"monitor restarted {ctx.now - started:.0f}s ago: refreshing from the agents "
                   f"(waiting for {nodes})")
        hints: tuple[str, ...] = ()
    else:
        oldest = min(silent.values())
        summary = (f"agent on {nodes} silent for {ctx.now - oldest:.0f}s: {what} unknown; "
                   "no verdict from old data")
        hints = (f"check the node{'s' if len(silent) > 1 else ''} ({nodes}): is it up, is hangwatch-agent "
                 "running (systemctl status hangwatch-agent), can it reach the monitor?",)
    states = dict.fromkeys(unknown, "unknown")
    return ctx.diagnosis("unknown", (), min(silent.values()), summary, evidence, hints, states=states)


def _ranks_unheard_since_restart(ctx: Context) -> Diagnosis | None:
    started, job = ctx.job.monitor_started_at, ctx.job
    if started is None or job.first_seen_at >= started or ctx.now - started > REBUILD_S:
        return None
    missing = ctx.missing_ranks()
    if not missing:
        return None
    heard = job.world_size - len(missing)
    return ctx.diagnosis("unknown", (), None, f"monitor restarted {ctx.now - started:.0f}s ago: refreshing from the "
                         f"agents ({heard} of {job.world_size} ranks heard)",
                         [f"{ranks_text(missing)}: not heard since the restart; their nodes' reports are on their way"])


def _first_lines(per_node: list[str]) -> list[str]:
    """A line per node for a few nodes; past NODE_LINES, a count of the rest (the summary names them
    all, collapsed): 12,500 silent nodes after a restart are not 12,500 lines of evidence."""
    if len(per_node) <= NODE_LINES:
        return per_node
    return [*per_node[:NODE_LINES], f"... and {len(per_node) - NODE_LINES} more nodes"]


def _refreshing(last: float, started: float | None, now: float) -> bool:
    """Nothing heard live since the restart, or heard only moments ago (its agent's kept reports, or a
    delta before its full report): a node being refreshed, not an agent gone quiet."""
    return started is not None and (last < started or now - last < REFRESHING_S)


def _silence_line(node: str, last: float, started: float | None, now: float) -> str:
    if started is not None and last < started:
        return f"node {node}: no report for {now - last:.0f}s (before the monitor restarted)"
    if _refreshing(last, started, now):
        return (f"node {node}: reports kept through an outage, or changes this monitor cannot build on yet; "
                "its full report is on its way")
    return f"node {node}: no report for {now - last:.0f}s"
