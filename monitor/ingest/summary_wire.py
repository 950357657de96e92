"""What a summarising relay sends a giant job's owner once a second: its share of the job, grouped.

A relay in front of a share of a giant job's nodes (``hangwatch-relay --summarise``, docs/scaling.md
"One job of 100,000 ranks") takes their reports itself and keeps their ranks' records as the monitor
does. Instead of forwarding 12,500 reports a second, each relay sends the job's owner one
``Summary`` a second: for each giant job, its ranks grouped by what they are doing (state, stack,
phase, what they run: every field of a rank's view but the few that differ rank to rank), a group
as one full view (its exemplar) and a compact row per member (rank, node, pid, CPU, times, step);
ranks that stand out (a group of a few, an exited rank) go as full views of their own. The owner
merges the summaries of its relays into the job's view and runs its rules as for any job
(monitor/ingest/summary_groups.py, monitor/ingest/summary_book.py).

The owner's answer to a summary may ask for ranks in ``detail`` ({job id: [rank, ...]}): the ranks its
answer names (a verdict's culprits), which the relay sends whole from then on, sockets, progress
history and settings included, for as long as the owner asks (``detail_request``).

Times are the relay's clock; the owner shifts them by ``received_at - sent_at`` past a skew that
matters at a second's grain. Everything here is checked against the monitor's limits before it
reaches a rule (monitor/engine/summaries.py): a summary is data from another process.
"""

from __future__ import annotations

import msgspec

from monitor.diagnosis.model import HostFacts, LauncherView, NcclComm, OrphanView, RankView

# The fields of a rank's view that differ rank to rank within a group (a member row carries them);
# every other field is its group's, taken from the exemplar.
MEMBER_FIELDS = ("rank", "node", "pid", "observed_at", "first_seen_at", "state_since", "cpu_percent",
                 "cpu_level_percent", "idle_since", "moved_at", "step", "held_since", "collective_wait_share",
                 "write_bytes_per_s", "run_queue_wait_level_percent", "cpu_throttled_level_percent",
                 "gpu_utilization_percent", "gpu_sm_clock_mhz", "cpu_since")


class Member(msgspec.Struct, array_like=True, frozen=True):
    """One rank of a group: the fields of MEMBER_FIELDS, its node as an index into ``Summary.nodes``,
    when its stack was taken and its latest progress (the group shares the rest)."""

    rank: int
    node: int
    pid: int | None
    observed_at: float
    first_seen_at: float
    state_since: float | None
    cpu_percent: float | None
    cpu_level_percent: float | None
    idle_since: float | None
    moved_at: float | None
    step: int | None
    held_since: float | None
    collective_wait_share: float | None
    write_bytes_per_s: float | None
    run_queue_wait_level_percent: float | None
    cpu_throttled_level_percent: float | None
    gpu_utilization_percent: float | None
    gpu_sm_clock_mhz: int | None
    cpu_since: float | None
    stack_taken_at: float | None
    progress_at: float | None


class RankGroup(msgspec.Struct, frozen=True):
    """Ranks doing the same thing at the same place: one full view, and a row per member (the
    exemplar's own among them)."""

    exemplar: RankView
    members: list[Member]


class JobSummary(msgspec.Struct, frozen=True):
    """A relay's share of one job: its ranks and what it knows of the job as a whole."""

    job_id: str
    world_size: int
    first_seen_at: float
    last_report_at: float
    last_progress_at: float | None = None
    # Ranks sent whole: those that stand out (a group of a few, ended ranks).
    ranks: list[RankView] = []
    groups: list[RankGroup] = []
    job_progress_times: list[float] = []
    job_step: int | None = None
    known_wait_sites: list[str] = []
    launchers: list[LauncherView] = []
    orphans: list[OrphanView] = []
    phase_marks: list[tuple[float, str]] = []
    silent_nodes: list[tuple[str, float]] = []
    replaying_nodes: list[tuple[str, float]] = []
    stacks_unavailable_reason: str | None = None
    working_since: float | None = None
    longest_pause_s: float = 0.0
    pauses_by_site: list[tuple[str, float]] = []
    job_step_time_s: float | None = None
    nccl: list[NcclComm] = []
    # Moves when a rank of the job starts, ends or joins at the relay: the owner judges it again at once.
    lifecycle_revision: int = 0


class Summary(msgspec.Struct, frozen=True):
    """One relay's summary of the giant jobs of its nodes."""

    relay: str
    sent_at: float
    # When the relay started: a relay started again sends every host's facts again.
    started_at: float
    # The nodes reporting to the relay now (``Member.node`` indexes this list).
    nodes: list[str]
    jobs: list[JobSummary] = []
    # The facts of the hosts that changed since the summary before (all of them when ``hosts_full``).
    hosts: dict[str, HostFacts] = {}
    hosts_full: bool = False


# The most ranks of one job the owner asks to have whole, and the most jobs it asks for at once.
DETAIL_RANKS_MAX = 64
DETAIL_JOBS_MAX = 64


def detail_request(asked: object, job_ids: set[str]) -> dict[str, frozenset[int]]:
    """The ranks the owner's answer asks to have whole, per job of ``job_ids`` (the summary's): its
    ``detail`` field read with care, what does not fit left out, and at most DETAIL_RANKS_MAX ranks a job."""
    if not isinstance(asked, dict):
        return {}
    out: dict[str, frozenset[int]] = {}
    for job_id, ranks in list(asked.items())[:DETAIL_JOBS_MAX]:
        if job_id not in job_ids or not isinstance(ranks, list):
            continue
        wanted = frozenset(r for r in ranks[:DETAIL_RANKS_MAX] if type(r) is int and r >= 0)
        if wanted:
            out[job_id] = wanted
    return out


def decode_summary(body: bytes) -> Summary:
    """A summary from its JSON body; msgspec.ValidationError (or DecodeError) when it is not one."""
    return msgspec.json.decode(body, type=Summary)


def encode_summary(summary: Summary) -> bytes:
    return msgspec.json.encode(summary)
