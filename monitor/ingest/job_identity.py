"""Which job, and which run of it, a report's entry belongs to.

A job is known by the id its ranks report (usually MASTER_ADDR:MASTER_PORT), but nodes may
spell one rendezvous differently (joined here as aliases), a launcher may name no job (joined
through its workers), and a new run may reuse the id of one that ended (started clean here).
These functions read and update the maps ``monitor.ingest.state.MonitorState`` holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from monitor.ingest.job_track import JobTrack
from monitor.ingest.tracks import NodeTrack
from monitor.ingest.wire import RankReport


def canonical_job_id(jobs: Mapping[str, JobTrack], aliases: dict[str, str], nodes: Mapping[str, NodeTrack],
                     job_id: str) -> str:
    """``job_id``, or the known job whose rendezvous it names another way (a join found is
    recorded in ``aliases`` and in that job's own ``aliases``).

    Nodes may spell MASTER_ADDR differently ("node0" on one, 10.0.0.1 on another): two
    "host:port" ids are one job when the ports match and both hosts name the same
    reporting node (its name, host name or an interface address). Loopback addresses
    name every node, so they never join anything.
    """
    if job_id in jobs or job_id in aliases:
        return aliases.get(job_id, job_id)
    parsed = host_port(job_id)
    node = node_named(nodes, parsed[0]) if parsed else None
    if parsed is None or node is None:
        return job_id
    for other in jobs:
        theirs = host_port(other)
        if theirs and theirs[1] == parsed[1] and theirs[0] != parsed[0] and node_named(nodes, theirs[0]) == node:
            aliases[job_id] = other
            jobs[other].aliases.add(job_id)
            return other
    return job_id


def host_port(job_id: str) -> tuple[str, int] | None:
    """("node0", 29500) from "node0:29500" (or "[fd00::1]:29500"); None for other ids."""
    host, sep, port = job_id.rpartition(":")
    if not sep or not host or not port.isdecimal() or host in ("local", "slurm"):
        return None
    return host, int(port)


def node_named(nodes: Mapping[str, NodeTrack], host: str) -> str | None:
    """The one reporting node that ``host`` (a name or an address) names; None for none or several."""
    host = host.strip("[]").lower()
    if host in ("localhost", "::1", "ip6-localhost") or host.startswith("127."):
        return None
    found = set()
    for n in nodes.values():
        names = {name for name in (n.node.lower(), n.host.hostname.lower()) if name}
        # "node0" names "node0.cluster" (and the reverse) when only one side is a full
        # name; two full names must match whole.
        short = {name.split(".", 1)[0] for name in names}
        full_known = any("." in name for name in names)
        if "." not in host:
            matched = host in short
        else:
            matched = host in names or (not full_known and not host[:1].isdecimal()
                                        and host.split(".", 1)[0] in names)
        if matched:
            found.add(n.node)
        elif any(a.split("/", 1)[0].lower() == host for i in n.host.interfaces for a in i.addresses):
            found.add(n.node)
    # An address several nodes have (docker0's 172.17.0.1) names none of them.
    return found.pop() if len(found) == 1 else None


def job_of_workers(jobs: Mapping[str, JobTrack], node: str, worker_pids: list[int]) -> str | None:
    """The job whose ranks on ``node`` are this launcher's workers (a launcher that names no job)."""
    pids = set(worker_pids)
    if not pids:
        return None
    for job in jobs.values():
        if any(t.node == node and t.pid in pids for t in job.ranks.values()):
            return job.job_id
    return None


def job_for(jobs: dict[str, JobTrack], forgotten_pids: Mapping[str, frozenset[tuple[str, int]]],
            job_id: str, node: str, pid: int, alive: bool) -> JobTrack:
    """The job a report entry belongs to, made if new. A new live process under the id of a job
    whose every rank and launcher ended is a new run reusing the id (the same MASTER_PORT):
    it starts clean instead of inheriting the last run's steps, exits and pace. (A
    process the job already had, listed again after it was missed, is not new.)"""
    job = jobs.get(job_id)
    if job is None:
        job = jobs[job_id] = JobTrack(job_id, previous_run_pids=forgotten_pids.get(job_id, frozenset()))
    elif alive and not job.any_alive() and (job.ranks or job.launchers):
        old = {(t.node, t.pid) for t in (*job.ranks.values(), *job.launchers.values())}
        if (node, pid) not in old:
            job = jobs[job_id] = JobTrack(job_id, previous_run_pids=frozenset(old), aliases=job.aliases)
    return job


def is_history(job: JobTrack, node: str, rr: RankReport) -> bool:
    """An ended process that no longer is the rank: the last run's, or one its launcher
    replaced (on this node or, after an elastic restart, on another)."""
    if (node, rr.pid) in job.previous_run_pids:
        return True
    current = job.ranks.get(rr.rank)
    return current is not None and current.alive and (current.node, current.pid) != (node, rr.pid)
