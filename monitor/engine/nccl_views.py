"""A job's NCCL communicators, joined from the RAS answers its nodes' agents sent.

Each agent sends the communicators of its own ranks with only those ranks in them, the pid
already the one the agent knows the process by (agent/nccl_ras.py). A communicator belongs
to a job when one of its ranks is a rank of the job: the same pid on the node that reported
it. The parts of one communicator (one per node) are joined by its hash.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from monitor.diagnosis.model import NcclComm, NcclMissingRank, NcclRank
from monitor.ingest.job_track import JobTrack
from monitor.ingest.tracks import NcclRasTrack, NodeTrack
from monitor.ingest.wire import NcclMissingRankReport, NcclRankReport

# (node, pid) -> the job's rank.
RankOfPid = Mapping[tuple[str, int], int]


@dataclass
class _Joined:
    hash: str
    size: int
    polled_at: float
    unchanged_since: float
    ranks: dict[int, NcclRank] = field(default_factory=dict)
    missing: dict[int, NcclMissingRank] = field(default_factory=dict)


def job_nccl(job: JobTrack, nodes: Sequence[NodeTrack]) -> tuple[NcclComm, ...]:
    answers = [(n.node, n.nccl_ras) for n in nodes if n.nccl_ras is not None]
    if not answers:
        return ()
    ranks = {(t.node, t.pid): t.rank for t in job.ranks.values()}
    return join_comms(answers, ranks, node_of_host(nodes))


def node_of_host(nodes: Iterable[NodeTrack]) -> dict[str, str]:
    """{address or host name: node}, for naming the node of a missing rank. An address that
    several nodes have (docker0's 172.17.0.1) names none of them."""
    owners: dict[str, set[str]] = {}
    for n in nodes:
        names = {n.node, n.host.hostname} | {a for i in n.host.interfaces for a in i.addresses}
        for name in names - {""}:
            owners.setdefault(name, set()).add(n.node)
    return {name: next(iter(found)) for name, found in owners.items() if len(found) == 1}


def join_comms(
    answers: Iterable[tuple[str, NcclRasTrack]], ranks: RankOfPid, hosts: Mapping[str, str]
) -> tuple[NcclComm, ...]:
    """The communicators with a rank of the job, each joined over the nodes that reported a part."""
    joined: dict[str, _Joined] = {}
    for node, track in answers:
        for comm in track.answer.communicators:
            present = [_rank(node, r, ranks) for r in comm.ranks]
            if not any(r.rank is not None for r in present):
                continue  # another job's, or a stale answer
            j = joined.get(comm.hash)
            if j is None:
                j = joined[comm.hash] = _Joined(comm.hash, comm.size, track.polled_at, track.unchanged_since)
            # As old as its oldest part; changed when any part last changed.
            j.polled_at = min(j.polled_at, track.polled_at)
            j.unchanged_since = max(j.unchanged_since, track.unchanged_since)
            j.size = max(j.size, comm.size)
            for r in present:
                j.ranks.setdefault(r.comm_rank, r)
            for m in comm.missing_ranks:
                j.missing.setdefault(m.rank, _missing(node, m, ranks, hosts))
    comms = [
        NcclComm(
            hash=j.hash, size=j.size, polled_at=j.polled_at, unchanged_since=j.unchanged_since,
            ranks=tuple(j.ranks[r] for r in sorted(j.ranks)),
            # A rank another node's part has data from is not missing (the parts differ in age).
            missing=tuple(j.missing[r] for r in sorted(j.missing) if r not in j.ranks),
        )
        for j in joined.values()
    ]
    return tuple(sorted(comms, key=lambda c: (-c.size, c.hash)))


def _rank(node: str, r: NcclRankReport, ranks: RankOfPid) -> NcclRank:
    flags = tuple(name for name, on in (("aborted", r.aborted), ("destroyed", r.destroyed),
                                        ("finalized", r.finalized)) if on)
    return NcclRank(
        comm_rank=r.rank, rank=ranks.get((node, r.pid)), node=node, pid=r.pid, host=r.host,
        counts=tuple(sorted(r.collective_counts.items())), async_error=r.async_error, flags=flags,
    )


def _missing(node: str, m: NcclMissingRankReport, ranks: RankOfPid, hosts: Mapping[str, str]) -> NcclMissingRank:
    owner = node if _is_loopback(m.host) else hosts.get(m.host)
    rank = ranks.get((owner, m.pid)) if owner is not None and m.pid is not None else None
    return NcclMissingRank(m.rank, rank, m.pid, m.host, m.unresponsive, m.considered_dead)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
