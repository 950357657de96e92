"""NCCL's own account of a stuck job (its RAS service, read by the agents): who diverged, who is gone.

With NCCL, every rank of a job where one rank issued an extra collective spins in
cudaStreamSynchronize at the same line: the stacks name no one. NCCL counts the collectives
each rank launched, by type, and knows the ranks it got no answer from. Read while the job
is stuck, the counts name the rank that diverged:

- per type, when a strict majority of ranks launched the same number, the others diverged;
  without a majority (two ranks), a rank that launched a type no other rank launched did,
  else the ranks that stopped first (the lowest count);
- a rank NCCL got no data from is named with its pid and host;
- asynchronous errors and aborted communicators are shown per rank.

Pure: ``with_nccl`` adds these to a deadlock or stall verdict; no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from monitor.diagnosis.model import Diagnosis, JobView, NcclComm, NcclMissingRank, NcclRank

# How firmly a finding names its culprits; the strongest kind found names the culprits.
ISSUED_ALONE = 3  # launched a type of collective no other rank launched
MAJORITY = 2  # differs from what a strict majority launched
STOPPED_FIRST = 1  # no majority: the lowest count
FACT = 0  # names no culprit (an async error, a missing rank)
VERDICTS_HELPED = ("deadlock", "stalled")
MAX_LINES = 12


@dataclass(frozen=True)
class Finding:
    strength: int
    culprits: tuple[int, ...]
    text: str
    hint: str | None = None


def current(job: JobView, since: float | None) -> list[NcclComm]:
    """Communicators read since the job stopped progressing, with counts a later poll found
    unchanged (on every node that has a part): counts that still move differ by the
    collectives in flight and say nothing, while a hang freezes them."""
    return [c for c in job.nccl if (since is None or c.polled_at >= since) and c.unchanged_since < c.polled_at]


def findings(job: JobView, since: float | None) -> list[Finding]:
    out: list[Finding] = []
    for comm in current(job, since):
        out += mismatches(comm) + missing(comm, job.world_size) + errors(comm)
    return out


def mismatches(comm: NcclComm) -> list[Finding]:
    if len(comm.ranks) < 2:
        return []
    kinds = sorted({kind for r in comm.ranks for kind, _ in r.counts})
    found = []
    for kind in kinds:
        counts = {r: dict(r.counts).get(kind, 0) for r in comm.ranks}
        if len(set(counts.values())) > 1:
            found.append(_mismatch(kind, counts))
    return found


def _mismatch(kind: str, counts: dict[NcclRank, int]) -> Finding:
    value, sharing = Counter(counts.values()).most_common(1)[0]
    if sharing * 2 > len(counts):
        odd = [r for r, n in counts.items() if n != value]
        others = [r for r, n in counts.items() if n == value]
        if value == 0:
            return _issued_alone(kind, odd, counts)
        high = max(counts[r] for r in odd)
        if high > value:
            return Finding(MAJORITY, _ids(odd), f"{_names(odd)} launched {kind} up to {high} while "
                           f"{_names(others)} stopped at {value}", _extra_hint(odd, kind))
        low = min(counts[r] for r in odd)
        return Finding(MAJORITY, _ids(odd), f"{_names(odd)} stopped at {kind} {low} while "
                       f"{_names(others)} launched up to {value}", _behind_hint(odd, kind))
    issued = [r for r, n in counts.items() if n > 0]
    if len(issued) < len(counts):
        return _issued_alone(kind, issued, counts)
    low, high = min(counts.values()), max(counts.values())
    behind = [r for r, n in counts.items() if n == low]
    ahead = [r for r, n in counts.items() if n == high]
    return Finding(STOPPED_FIRST, _ids(behind), f"{_names(behind)} stopped at {kind} {low} while "
                   f"{_names(ahead)} launched up to {high}", _behind_hint(behind, kind))


def _issued_alone(kind: str, issued: list[NcclRank], counts: dict[NcclRank, int]) -> Finding:
    high = max(counts[r] for r in issued)
    number = "#1" if high == 1 else f"#1..#{high}"
    others = "no other rank issued" if len(issued) == 1 else "the other ranks never issued"
    return Finding(ISSUED_ALONE, _ids(issued), f"{_names(issued)} issued {kind} {number} that {others}",
                   _extra_hint(issued, kind))


def _extra_hint(ranks: list[NcclRank], kind: str) -> str:
    return (f"{_names(ranks)} issued a {kind} the others did not: look for a collective under a "
            "rank-dependent branch (`if rank == 0:` logging, checkpointing or evaluation that calls "
            f"{kind.lower()}), or uneven batches per rank.")


def _behind_hint(ranks: list[NcclRank], kind: str) -> str:
    return (f"{_names(ranks)} stopped issuing {kind} before the others: look at what it does instead "
            "(its stack above): it left the loop early (fewer batches), waits on something else, or "
            "skipped a collective the others ran.")


def missing(comm: NcclComm, world_size: int) -> list[Finding]:
    found = []
    for m in comm.missing:
        rank = _missing_rank_id(m, comm, world_size)
        state = "considered dead" if m.considered_dead else "unresponsive" if m.unresponsive else "no data"
        name = f"rank {rank}" if rank is not None else f"rank {m.comm_rank} of communicator {comm.hash}"
        pid = f"pid {m.pid}" if m.pid is not None else "pid unknown"
        found.append(Finding(
            FACT, (rank,) if rank is not None else (),
            f"{name} ({pid} on {m.host or 'an unknown host'}) gives NCCL no data: {state}",
            f"NCCL cannot reach {name} ({pid} on {m.host}): check that process and its node "
            "(exited or killed, hung in the kernel, or its node lost the network).",
        ))
    return found


def _missing_rank_id(m: NcclMissingRank, comm: NcclComm, world_size: int) -> int | None:
    if m.rank is not None:
        return m.rank
    # A communicator of the whole world (the default group) numbers its ranks as the job does.
    return m.comm_rank if comm.size == world_size else None


def errors(comm: NcclComm) -> list[Finding]:
    found = []
    for r in comm.ranks:
        if r.async_error and r.async_error != "in progress":  # a nonblocking init, not an error
            found.append(Finding(FACT, (), f"{_name(r)} reports an NCCL asynchronous error: {r.async_error}"))
        if r.flags:
            found.append(Finding(FACT, (), f"{_name(r)}'s communicator {comm.hash} is {', '.join(r.flags)}"))
    return found


def culprits_of(found: list[Finding]) -> tuple[int, ...]:
    """The ranks the strongest mismatch names; without a mismatch, the ranks NCCL cannot reach."""
    strongest = max((f.strength for f in found), default=FACT)
    if strongest > FACT:
        return _ids_of(f for f in found if f.strength == strongest)
    return _ids_of(f for f in found if f.culprits)


def with_nccl(job: JobView, result: Diagnosis, since: float | None, superseded: tuple[str, ...] = ()) -> Diagnosis:
    """A deadlock or stall verdict with NCCL's findings: its culprits, evidence and hints.

    ``superseded``: the verdict's hints that guess at what NCCL's counts now tell; dropped
    when a count mismatch names ranks."""
    if result.verdict not in VERDICTS_HELPED:
        return result
    found = findings(job, since)
    if not found:
        return result
    named = culprits_of(found)
    lead = max(found, key=lambda f: (f.strength, bool(f.culprits)))
    comms = current(job, since)
    age = job.now - min(c.polled_at for c in comms)
    still = job.now - max(c.unchanged_since for c in comms)
    evidence = [f"NCCL RAS: {f.text}" for f in found][:MAX_LINES]
    evidence.append(f"NCCL RAS answer read {age:.0f}s ago, unchanged for {still:.0f}s")
    hints = list(dict.fromkeys(f.hint for f in found if f.hint and f.strength == lead.strength))
    kept = result.hints
    if lead.strength > FACT:  # NCCL told the ranks apart: the stacks' guess no longer stands
        kept = tuple(h for h in kept if h not in superseded)
    return replace(
        result,
        culprit_ranks=named or result.culprit_ranks,
        summary=f"{result.summary}; NCCL: {lead.text}",
        evidence=(*result.evidence, *evidence),
        hints=(*hints, *kept),
    )


def _name(r: NcclRank) -> str:
    return f"rank {r.rank}" if r.rank is not None else f"communicator rank {r.comm_rank} (pid {r.pid})"


def _names(ranks: list[NcclRank]) -> str:
    known = sorted(r.rank for r in ranks if r.rank is not None)
    text = [f"{'rank' if len(known) == 1 else 'ranks'} {', '.join(map(str, known))}"] if known else []
    text += [_name(r) for r in ranks if r.rank is None]
    return " and ".join(text)


def _ids(ranks: list[NcclRank]) -> tuple[int, ...]:
    return tuple(sorted(r.rank for r in ranks if r.rank is not None))


def _ids_of(found: Iterable[Finding]) -> tuple[int, ...]:
    return tuple(sorted({r for f in found for r in f.culprits}))
