"""A giant job's ranks into groups at a relay, and the groups back into rank views at the owner.

At the relay (``group_ranks``): ranks whose views agree on everything but the fields of
``MEMBER_FIELDS`` (their CPU, times, step, pid, node) form a group, sent as one full view and a row
per member; the stack's frames, the phase, the environment (less what names the rank) are the
group's. A group of at most DETAIL_MAX ranks, and an ended rank, go whole: the odd ones out, where
culprits are, keep every detail (sockets, progress history). A healthy job of 100,000 ranks is a
few hundred groups, a deadlocked one a handful.

At the owner (``expand``): each member's view is its exemplar's with the member's own fields, made
without dataclass machinery (a dict copy per rank: ~1 us). What a member does not carry (its
sockets, its progress history before its latest, its per-rank settings) is its exemplar's or left
out, and the answer says ranks' details come from the relay's own page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import msgspec

from monitor.diagnosis.model import JobView, RankView, Stack
from monitor.ingest.summary_wire import MEMBER_FIELDS, JobSummary, Member, RankGroup

# A group of at most this many ranks is sent as whole views.
DETAIL_MAX = 4
# Settings that name the rank itself: not part of what a group shares, and not given to its members.
PER_RANK_ENV = frozenset({"ROLE_RANK", "GROUP_RANK", "TORCHELASTIC_ERROR_FILE", "CUDA_VISIBLE_DEVICES"})
# Fields of a view a group key takes in another form (below), or that are a rank's own.
# The cgroup names the node's pod or slice: one group per node if it were the group's (a member is
# given none; its CPU denied, throttling included, is its own row's).
_OWN_OR_DERIVED = frozenset(MEMBER_FIELDS) | {"exit", "progress_times", "progress_points", "sockets", "stack",
                                              "log_phase", "env", "step_time_s", "blocked_io", "cgroup",
                                              # Worked out per rank from its own report times: never shared.
                                              "cpu_level_span_s"}
KEY_FIELDS = tuple(f.name for f in dataclasses.fields(RankView) if f.name not in _OWN_OR_DERIVED)
# Times a view holds, shifted onto the owner's clock when a relay's clock is off by more than
# CLOCK_SKEW_S; within it, a second's grain does not care.
CLOCK_SKEW_S = 0.5
_NONE: Any = object()


def group_key(view: RankView) -> tuple[Any, ...]:
    fields = view.__dict__
    stack, phase, blocked = view.stack, view.log_phase, view.blocked_io
    return (tuple(fields[f] for f in KEY_FIELDS),
            None if stack is None else (stack.frames, stack.native, stack.active),
            None if phase is None else (phase.phase, phase.line),
            tuple(kv for kv in view.env if kv[0] not in PER_RANK_ENV),
            None if blocked is None else blocked.syscall)


# id(view) -> (the view, its group key, its member row): what the last summary worked out of each rank's
# view. A rank that did not report since has the same view object (monitor/engine/views.rank_view),
# so at a report every 10 s nine ranks in ten cost a lookup.
RowMemo = dict[int, tuple[RankView, tuple[Any, ...], Member | None]]


def group_ranks(views: Iterable[RankView], node_index: dict[str, int], memo: RowMemo | None = None,
                detail: AbstractSet[int] = frozenset()) -> tuple[list[RankView], list[RankGroup]]:
    """(ranks sent whole, groups). ``node_index``: node name -> its index in the summary's list,
    added to for nodes not in it yet. ``memo``: the last call's, replaced by this one's. ``detail``:
    ranks the owner asked to have whole (summary_wire.detail_request)."""
    groups: dict[tuple[Any, ...], list[tuple[RankView, Member | None]]] = {}
    whole: list[RankView] = []
    known = memo if memo is not None else {}
    for view in views:
        if view.exit is not None or not view.alive or view.rank in detail:
            whole.append(view)
            continue
        hit = known.get(id(view))
        if hit is not None and hit[0] is view:
            key, row = hit[1], hit[2]
        else:
            key, row = group_key(view), None
        try:
            groups.setdefault(key, []).append((view, row))
        except TypeError:  # a field that does not hash: the rank goes whole
            whole.append(view)
    out: list[RankGroup] = []
    kept: RowMemo = {}
    for key, members in groups.items():
        if len(members) <= DETAIL_MAX:
            whole.extend(view for view, _ in members)
            continue
        rows = []
        for view, row in members:
            if row is None or node_index.get(view.node) != row.node:
                row = member_row(view, node_index)
            rows.append(row)
            kept[id(view)] = (view, key, row)
        out.append(RankGroup(exemplar=members[0][0], members=rows))
    if memo is not None:
        memo.clear()
        memo.update(kept)
    whole.sort(key=lambda v: v.rank)
    return whole, out


def member_row(view: RankView, node_index: dict[str, int]) -> Member:
    index = node_index.setdefault(view.node, len(node_index))
    return Member(view.rank, index, view.pid, view.observed_at, view.first_seen_at, view.state_since,
                  view.cpu_percent, view.cpu_level_percent, view.idle_since, view.moved_at, view.step,
                  view.held_since, view.collective_wait_share, view.write_bytes_per_s,
                  view.run_queue_wait_level_percent, view.cpu_throttled_level_percent,
                  view.gpu_utilization_percent, view.gpu_sm_clock_mhz, view.cpu_since,
                  view.stack.taken_at if view.stack is not None else None,
                  view.progress_times[-1] if view.progress_times else None)


# A member row's first fields, in order, are these fields of a view (``node`` an index, replaced).
_ROW_FIELDS = ("rank", "node", "pid", "observed_at", "first_seen_at", "state_since", "cpu_percent",
               "cpu_level_percent", "idle_since", "moved_at", "step", "held_since", "collective_wait_share",
               "write_bytes_per_s", "run_queue_wait_level_percent", "cpu_throttled_level_percent",
               "gpu_utilization_percent", "gpu_sm_clock_mhz", "cpu_since")
_ROW_TIMES = tuple(i for i, f in enumerate(_ROW_FIELDS) if f in (
    "observed_at", "first_seen_at", "state_since", "idle_since", "moved_at", "held_since", "cpu_since"))


def expand(group: RankGroup, nodes: Sequence[str], offset: float = 0.0) -> list[RankView]:
    """The group's members as rank views (the owner's clock: ``offset`` added to the relay's times).
    IndexError: a member names a node the summary does not list."""
    exemplar = group.exemplar if offset == 0.0 else shift(group.exemplar, offset)
    base = dict(exemplar.__dict__)
    base.update(sockets=(), progress_points=(), env=tuple(kv for kv in exemplar.env if kv[0] not in PER_RANK_ENV))
    stack, times = exemplar.stack, exemplar.progress_times
    stacks: dict[float | None, Stack | None] = {}
    progress: dict[float | None, tuple[float, ...]] = {}
    new, set_attribute, as_tuple = object.__new__, object.__setattr__, msgspec.structs.astuple
    fields_of_row = _ROW_FIELDS
    out = []
    for m in group.members:
        row = as_tuple(m)
        taken_at, progress_at = row[-2], row[-1]
        if offset:
            shifted = list(row)
            for i in _ROW_TIMES:
                if shifted[i] is not None:
                    shifted[i] += offset
            row = tuple(shifted)
            taken_at, progress_at = shifted_time(taken_at, offset), shifted_time(progress_at, offset)
        held = stacks.get(taken_at, _NONE)
        if held is _NONE:
            held = stacks[taken_at] = stack if stack is None or taken_at is None or taken_at == stack.taken_at else \
                Stack(taken_at, stack.frames, stack.native, stack.active)
        history = progress.get(progress_at)
        if history is None:
            history = progress[progress_at] = () if progress_at is None else (
                times if times and times[-1] == progress_at else
                tuple(t for t in times if t < progress_at) + (progress_at,))
        fields = base.copy()
        fields.update(zip(fields_of_row, row))
        fields["node"] = nodes[row[1]]
        fields["stack"] = held
        fields["progress_times"] = history
        fields["cgroup"] = None
        view = new(RankView)
        set_attribute(view, "__dict__", fields)
        out.append(view)
    return out


def shifted_time(t: float | None, offset: float) -> float | None:
    return None if t is None else t + offset


def shift(view: RankView, offset: float) -> RankView:
    """``view`` with its times ``offset`` later (a relay's clock onto the owner's)."""
    if offset == 0.0:
        return view
    return dataclasses.replace(
        view, observed_at=view.observed_at + offset, first_seen_at=view.first_seen_at + offset,
        state_since=shifted_time(view.state_since, offset), idle_since=shifted_time(view.idle_since, offset),
        cpu_since=shifted_time(view.cpu_since, offset),
        moved_at=shifted_time(view.moved_at, offset), held_since=shifted_time(view.held_since, offset),
        progress_times=tuple(t + offset for t in view.progress_times),
        progress_points=tuple((t + offset, s) for t, s in view.progress_points),
        stack=None if view.stack is None else dataclasses.replace(view.stack, taken_at=view.stack.taken_at + offset),
        log_phase=None if view.log_phase is None else dataclasses.replace(view.log_phase,
                                                                          seen_at=view.log_phase.seen_at + offset),
        exit=None if view.exit is None else dataclasses.replace(view.exit, at=view.exit.at + offset),
        sockets=tuple(s if s.since is None else dataclasses.replace(s, since=s.since + offset) for s in view.sockets))


def job_summary(view: JobView, node_index: dict[str, int], last_report_at: float,
                last_progress_at: float | None, lifecycle_revision: int, memo: RowMemo | None = None,
                detail: AbstractSet[int] = frozenset()) -> JobSummary:
    """A relay's share of a job, from its own view of the job (monitor/engine/views.job_view);
    ``detail``: its ranks the owner asked to have whole."""
    whole, groups = group_ranks(view.ranks, node_index, memo, detail)
    return JobSummary(
        job_id=view.job_id, world_size=view.world_size, first_seen_at=view.first_seen_at,
        last_report_at=last_report_at, last_progress_at=last_progress_at, ranks=whole, groups=groups,
        job_progress_times=list(view.job_progress_times), job_step=view.job_step,
        known_wait_sites=sorted(view.known_wait_sites), launchers=list(view.launchers), orphans=list(view.orphans),
        phase_marks=list(view.phase_marks), silent_nodes=list(view.silent_nodes),
        replaying_nodes=list(view.replaying_nodes), stacks_unavailable_reason=view.stacks_unavailable_reason,
        working_since=view.working_since, longest_pause_s=view.longest_pause_s,
        pauses_by_site=list(view.pauses_by_site), job_step_time_s=view.job_step_time_s, nccl=list(view.nccl),
        lifecycle_revision=lifecycle_revision)
