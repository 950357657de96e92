"""What the monitor knows about each job, rank and node, kept up to date report by report.

Every time is put on the monitor's clock as it comes in: the agent's clock is
shifted by ``received_at - sent_at`` of the report that carried it.
``MonitorState`` holds the maps and walks each report: the records are in ``monitor.ingest.tracks``
and ``monitor.ingest.job_track``; which job an entry belongs to in ``monitor.ingest.job_identity``; taking
an entry in, in ``monitor.ingest.rank_ingest`` and ``monitor.ingest.progress_ingest``; what is forgotten
when, in ``monitor.ingest.retention``. ``monitor.engine.views`` turns this into the diagnosis's ``JobView``.
"""

from __future__ import annotations

from collections.abc import Container

from monitor.ingest import retention
from monitor.diagnosis import stacks
from monitor.diagnosis.model import CPU_LEVEL_WINDOW_S
from monitor.ingest.job_identity import canonical_job_id, is_history, job_for, job_of_workers
from monitor.ingest.job_track import JobTrack
from monitor.ingest.rank_claims import note_conflict, note_world, past_the_world, rival_holder
from monitor.ingest.report_order import runs_replaced
from monitor.ingest.rank_ingest import WaitSite, apply_launcher, apply_rank, learn_wait_sites, mark_vanished
from monitor.ingest.tracks import NcclRasTrack, NodeTrack
from monitor.ingest.wire import HostReport, Report


class MonitorState:
    """Every job and node the monitor knows, and the memory of the jobs it forgot."""

    def __init__(self, cpu_level_window_s: float = CPU_LEVEL_WINDOW_S) -> None:
        # Each rank's CPU level is taken over this window (the straggler_window_s setting).
        self.cpu_level_window_s = cpu_level_window_s
        self.jobs: dict[str, JobTrack] = {}
        self.nodes: dict[str, NodeTrack] = {}
        # Ended jobs already forgotten, and when: an agent may go on listing their dead
        # ranks for a while, which must not bring the job back. A live rank does.
        self.forgotten: dict[str, float] = {}
        # Job ids that name a known job's rendezvous another way (a host name on one node,
        # its address on another): alias -> the id the job was first seen under.
        self.aliases: dict[str, str] = {}
        # (node, pid) of forgotten jobs' processes, by id: a new run under the id skips them.
        self.forgotten_pids: dict[str, frozenset[tuple[str, int]]] = {}
        # Ranks claimed by a node while another node holds them (monitor.ingest.rank_claims).
        self.claims_refused = 0
        # The jobs each node brought ranks of (monitor/ingest/limits.py: max_jobs_per_node counts them);
        # a job forgotten since leaves its nodes' sets when next read (jobs_of_node).
        self.node_jobs: dict[str, set[str]] = {}

    def apply(self, report: Report, received_at: float, wait_site: WaitSite = stacks.wait_site) -> set[str]:
        """Take in one accepted report; return the ids of the jobs it touched."""
        offset = received_at - report.sent_at
        node = self.nodes.get(report.node)
        previous_keys = node.rank_keys if node else set()
        previous_launchers = node.launcher_keys if node else set()
        node = NodeTrack(
            node=report.node,
            last_report_at=received_at,
            offset=offset,
            agent=report.agent,
            host=report.host or (node.host if node else HostReport()),
            collectors=tuple(report.collectors),
            orphans=tuple(report.orphans),
            nccl_ras=_nccl_ras(report, node, offset),
            collector_errors=dict(node.collector_errors) if node else {},
            stack_failures=(node.stack_failures if node else 0) + sum(1 for r in report.ranks if r.stack_error),
            live=not report.replayed,
            seq=report.seq,
            past_runs=runs_replaced(node.last_taken() if node else None, report),
            facts_cache=node.facts_cache if node else None,
        )
        for health in report.collectors:
            if not health.ok:
                node.collector_errors[health.name] = node.collector_errors.get(health.name, 0) + 1
        self.nodes[report.node] = node
        touched: set[str] = set()
        # An agent lists an ended process for minutes after it ended: once its rank runs
        # again under a new pid (a launcher restart), the old entry is history, not news.
        ids = {r.job_id: canonical_job_id(self.jobs, self.aliases, self.nodes, r.job_id) for r in report.ranks}
        live_ranks = {(ids[r.job_id], r.rank) for r in report.ranks if r.alive}
        live_worlds: dict[str, int] = {}  # job -> the world size this node's live ranks of it report
        for rank_report in report.ranks:
            job_id = ids[rank_report.job_id]
            if not rank_report.alive and (
                job_id in self.forgotten or rank_report.job_id in self.forgotten or (job_id, rank_report.rank) in live_ranks
            ):
                continue
            self.forgotten.pop(job_id, None)
            job = job_for(self.jobs, self.forgotten_pids, job_id, report.node, rank_report.pid, rank_report.alive)
            if not rank_report.alive and is_history(job, report.node, rank_report):
                continue
            beyond = past_the_world(job, report.node, rank_report.rank, rank_report.world_size, self.nodes, received_at)
            if beyond is not None:
                note_conflict(job, rank_report.rank, report.node, beyond[0], received_at, reason=beyond[1])
                self.claims_refused += 1
                touched.add(job.job_id)  # its conflicts changed: its answer is due again
                continue
            if rank_report.alive:
                holder = rival_holder(job, report.node, rank_report.rank, self.nodes, received_at)
                if holder is not None:
                    note_conflict(job, rank_report.rank, report.node, holder, received_at)
                    self.claims_refused += 1
                    touched.add(job.job_id)
                    continue
                conflict = job.claim_conflicts.get(rank_report.rank)
                if conflict is not None and conflict.claimed_by == report.node:
                    del job.claim_conflicts[rank_report.rank]  # the claim is taken now: the rank moved
            apply_rank(job, report.node, rank_report, received_at, offset, wait_site, self.cpu_level_window_s)
            node.rank_keys.add((job_id, rank_report.rank))
            job.node_joined_at.setdefault(report.node, received_at)
            self.node_jobs.setdefault(report.node, set()).add(job.job_id)
            if rank_report.alive:
                live_worlds[job.job_id] = min(rank_report.world_size, live_worlds.get(job.job_id, rank_report.world_size))
            touched.add(job.job_id)
        for job_id in {j for j, _ in previous_keys} | touched:
            if job_id in self.jobs:
                note_world(self.jobs[job_id], report.node, live_worlds.get(job_id))
        for job_id, rank in previous_keys - node.rank_keys:
            job = self.jobs.get(job_id)
            track = job.ranks.get(rank) if job else None
            if job and track and track.node == report.node and track.alive:
                mark_vanished(track)
                job.lifecycle_revision += 1
                touched.add(job_id)
        for launcher_report in report.launchers:
            named = launcher_report.job_id
            job_id = (
                (canonical_job_id(self.jobs, self.aliases, self.nodes, named) if named else None)
                or job_of_workers(self.jobs, report.node, launcher_report.worker_pids)
                # Its workers gone, a launcher that names no job stays with the job it had.
                or next((j for j, pid in previous_launchers if pid == launcher_report.pid), None)
            )
            if not job_id or (not launcher_report.alive and job_id in self.forgotten):
                continue
            self.forgotten.pop(job_id, None)
            job = job_for(
                self.jobs, self.forgotten_pids, job_id, report.node, launcher_report.pid, launcher_report.alive
            )
            if not launcher_report.alive and (report.node, launcher_report.pid) in job.previous_run_pids:
                continue
            apply_launcher(job, report.node, launcher_report, received_at, offset)
            node.launcher_keys.add((job_id, launcher_report.pid))
            touched.add(job_id)
        for job_id, pid in previous_launchers - node.launcher_keys:
            job = self.jobs.get(job_id)
            launcher = job.launchers.get((report.node, pid)) if job else None
            if job and launcher and launcher.alive:
                mark_vanished(launcher)
                job.lifecycle_revision += 1
                touched.add(job_id)
        for job_id in touched:
            learn_wait_sites(self.jobs[job_id])
        return touched

    def resolve(self, job_id: str) -> str:
        """The id the monitor keeps a job under, given any id its nodes reported."""
        return self.aliases.get(job_id, job_id)

    def make_room_for_node(self, node: str, max_nodes: int, now: float, silent_s: float) -> str | None:
        """See ``retention.make_room_for_node``: the node forgotten to let ``node`` in, if any."""
        return retention.make_room_for_node(self.nodes, node, max_nodes, now, silent_s)

    def make_room_for_jobs(self, needed: int, max_jobs: int, now: float, silent_s: float) -> list[str]:
        """See ``retention.make_room_for_jobs``: the jobs forgotten to let ``needed`` new ones in."""
        return retention.make_room_for_jobs(self.jobs, self.aliases, needed, max_jobs, now, silent_s)

    def make_room_for_ranks(self, needed: int, max_ranks: int, now: float, silent_s: float) -> list[str]:
        """See ``retention.make_room_for_ranks``: the jobs forgotten to let ``needed`` new ranks in."""
        return retention.make_room_for_ranks(self.jobs, self.aliases, needed, max_ranks, now, silent_s)

    def jobs_of_node(self, node: str) -> set[str]:
        """The jobs ``node`` brought ranks of that the monitor still keeps."""
        held = self.node_jobs.get(node)
        if not held:
            return set()
        for gone in [job_id for job_id in held if job_id not in self.jobs]:
            held.discard(gone)
        return held

    def make_room_in_node(self, node: str, needed: int, now: float, silent_s: float) -> list[str]:
        """See ``retention.make_room_in_node``: the node's own jobs forgotten to let new ones in."""
        return retention.make_room_in_node(self.jobs, self.aliases, self.forgotten, self.forgotten_pids,
                                           self.jobs_of_node(node), node, needed, now, silent_s)

    def known_ranks(self, job_id: str) -> Container[int]:
        job = self.jobs.get(job_id)
        return job.ranks if job is not None else ()

    def ranks_total(self) -> int:
        return retention.ranks_total(self.jobs)

    def prune(self, now: float, retention_s: float) -> list[str]:
        """See ``retention.prune``: the ids of the jobs forgotten."""
        return retention.prune(
            jobs=self.jobs,
            nodes=self.nodes,
            aliases=self.aliases,
            forgotten=self.forgotten,
            forgotten_pids=self.forgotten_pids,
            now=now,
            retention_s=retention_s,
        )


def _nccl_ras(report: Report, previous: NodeTrack | None, offset: float) -> NcclRasTrack | None:
    """The node's RAS answer after this report: a delta's null keeps the last one, a full report's
    null means the agent does not poll."""
    answer = report.nccl_ras
    if answer is None:
        return previous.nccl_ras if previous is not None and report.delta else None
    since = answer.unchanged_since if answer.unchanged_since is not None else answer.polled_at
    return NcclRasTrack(answer.polled_at + offset, min(since, answer.polled_at) + offset, answer)
