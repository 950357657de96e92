"""What every rule shares: the job, its cadence, each rank's activity, and wording helpers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from monitor.diagnosis.activity import Activity
from monitor.diagnosis.cadence import Cadence
from monitor.diagnosis.model import Diagnosis, JobView, RankDiagnosis, WaitGroup


@dataclass
class Context:
    job: JobView
    cadence: Cadence
    activities: dict[int, Activity] = field(default_factory=dict)

    @property
    def now(self) -> float:
        return self.job.now

    def live(self) -> list[Activity]:
        return [a for a in self.activities.values() if a.rank.alive]

    def missing_ranks(self) -> list[int]:
        ranks, world = self.activities, self.job.world_size
        if ranks and len(ranks) >= world and min(ranks) >= 0 and max(ranks) < world:
            return []  # as many distinct ranks as the world, all within it: no set of 100,000 to make
        return sorted(set(range(world)) - set(ranks))

    def node_of_address(self, address: str) -> str | None:
        """The reporting node that owns ``address`` on one of its interfaces."""
        for node, facts in self.job.hosts.items():
            if any(address in i.addresses for i in facts.interfaces):
                return node
        return None

    def diagnosis(
        self,
        verdict: str,
        culprits: Iterable[int],
        since: float | None,
        summary: str,
        evidence: Iterable[str] = (),
        hints: Iterable[str] = (),
        groups: Iterable[WaitGroup] = (),
        states: dict[int, str] | None = None,
    ) -> Diagnosis:
        states = states or {}
        activities = self.activities
        # In rank order: the activities are made from the job's ranks, which are (JobView); a dict's keys
        # in order are checked in C, the sort of 100,000 activities by a Python key is not.
        in_order = list(activities) == sorted(activities)
        ordered = activities.values() if in_order else sorted(activities.values(), key=lambda a: a.rank.rank)
        get_state = states.get
        ranks = tuple(
            RankDiagnosis(a.rank.rank, get_state(a.rank.rank, a.kind), a.top_frame, a.wait.site if a.wait else None)
            for a in ordered
        )
        return Diagnosis(
            verdict=verdict,
            culprit_ranks=tuple(sorted(set(culprits))),
            since=since,
            summary=summary,
            evidence=tuple(evidence),
            hints=tuple(hints),
            ranks=ranks,
            groups=tuple(groups),
        )


# How the agent marks a step read through a learned line template (agent/logs.py).
LEARNED = "learned"
HEARTBEAT = "(heartbeat,"

# Up to this many ranks are listed one by one; more are written as runs ("ranks 0-511, 600").
RANKS_LISTED = 16
RUNS_LISTED = 20


def ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    word = "rank" if len(ranks) == 1 else "ranks"
    if len(ranks) <= RANKS_LISTED:
        return f"{word} {', '.join(str(r) for r in ranks)}"
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:RUNS_LISTED])
    more = f", ... ({len(ranks)} ranks in all)" if len(runs) > RUNS_LISTED else ""
    return f"{word} {shown}{more}"


def wait_verb(ranks: Iterable[int]) -> str:
    """"rank 1 waits" / "ranks 0, 2 wait"."""
    ranks = list(ranks)
    return f"{ranks_text(ranks)} {'waits' if len(ranks) == 1 else 'wait'}"


def cpu_text(a: Activity) -> str:
    return "CPU unknown" if a.rank.cpu_percent is None else f"{a.rank.cpu_percent:.0f}% CPU"


def where(a: Activity) -> str:
    if a.wait is not None:
        return a.wait.detail
    return a.top_frame or "no stack yet"


def describe(a: Activity) -> str:
    text = f"rank {a.rank.rank} on {a.rank.node}: {a.kind}, {where(a)}, {cpu_text(a)}"
    if a.rank.gpu_utilization_percent is not None:
        # On GPUs CPU says little (NCCL waits spin): the GPU's own load is the better hint.
        text += f", GPU {a.rank.gpu_utilization_percent:.0f}% busy"
    return text


# Evidence gives each rank a line up to this many ranks; past that, a line per group of ranks
# doing the same thing at the same place, the smallest groups (the odd ones out) first.
RANK_LINES_MAX = 32
GROUP_LINES_MAX = 12


def describe_all(activities: Sequence[Activity], suffix: str = "") -> list[str]:
    """``describe`` for each rank, or, for many ranks, one line per group (what a person can read
    at 10,000 ranks: "ranks 0-4, 6-9999 on 1250 nodes: in_collective, all_reduce ...")."""
    if len(activities) <= RANK_LINES_MAX:
        return [describe(a) + suffix for a in activities]
    groups: dict[tuple[str, str], list[Activity]] = {}
    for a in activities:
        groups.setdefault((a.kind, where(a)), []).append(a)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0].rank.rank))
    if len(ordered) <= GROUP_LINES_MAX:
        return [_describe_group(g) + suffix for g in ordered]
    # The smallest groups (the odd ones out) and the largest (where the job as a whole is).
    shown, rest = ordered[: GROUP_LINES_MAX - 1] + ordered[-1:], ordered[GROUP_LINES_MAX - 1 : -1]
    lines = [_describe_group(g) + suffix for g in shown]
    lines.insert(-1, f"... {len(rest)} more groups ({sum(len(g) for g in rest)} ranks)")
    return lines


def _describe_group(group: list[Activity]) -> str:
    first = group[0]
    if len(group) == 1:
        return describe(first)
    nodes = {a.rank.node for a in group}
    on = f"on {next(iter(nodes))}" if len(nodes) == 1 else f"on {len(nodes)} nodes"
    cpu = [a.rank.cpu_percent for a in group if a.rank.cpu_percent is not None]
    cpu_range = "CPU unknown" if not cpu else (
        f"{min(cpu):.0f}% CPU" if round(min(cpu)) == round(max(cpu)) else f"{min(cpu):.0f}-{max(cpu):.0f}% CPU")
    gpu = [a.rank.gpu_utilization_percent for a in group if a.rank.gpu_utilization_percent is not None]
    # On GPUs CPU says little (NCCL waits spin): the GPUs' own load is the better hint.
    gpu_text = f", GPU {min(gpu):.0f}-{max(gpu):.0f}% busy" if gpu else ""
    return f"{ranks_text(a.rank.rank for a in group)} {on}: {first.kind}, {where(first)}, {cpu_range}{gpu_text}"


def progress_evidence(ctx: Context) -> list[str]:
    silent = ctx.cadence.silent_for(ctx.now)
    if silent is None:
        return ["no progress line seen yet"]
    usual = ctx.cadence.median_interval_s
    # Progress lines are timed when the agent reads them (once per interval), so this
    # is the usual gap between sightings of progress, not the step time itself.
    pace = f" (progress usually seen every {usual:.2f}s)" if usual is not None else ""
    lines = [f"no progress for {silent:.1f}s{pace}"]
    learned = next((r.progress_pattern for r in ctx.job.ranks
                    if r.progress_pattern and r.progress_pattern.startswith(LEARNED)), None)
    if learned is not None:
        # A format no built-in pattern knows: say what the pace was read from, so a person can judge it.
        how = learned[len(LEARNED):].lstrip()
        if how.startswith(HEARTBEAT):
            lines.append(f"progress read from a line that recurs at a steady pace without a step number "
                         f"(steps are counted in its lines) {how}")
        else:
            lines.append(f"steps read from a learned line format {how}")
    return lines
