"""PyTorch Flight Recorder's account of a stuck job: how far each rank got in each process group.

torch numbers the collectives of each process group on every rank alike (#1, #2, ...) and its
Flight Recorder keeps, per group, the last one each rank enqueued, started and completed. In
dumps written after the job stopped, the ranks of a group that are behind the others are the
ones that stopped issuing collectives; the others wait for them in the next one:

- per group with dumps of two ranks or more, ranks that enqueued fewer collectives than the
  others are named;
- else ranks at the same number but in different collectives (a rank-0-only broadcast where
  the others run all_reduce) disagree: a strict minority is named;
- else the first counter that differs (completed, then started) names the ranks at the lowest;
- a dump that could not be read, or that predates the stall, is said, not used.

Pure: ``with_flight_recorder`` adds these to a deadlock or stall verdict; its culprits count
only when the verdict had none (the stacks and NCCL's counts come first). No I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from monitor.diagnosis.context import ranks_text
from monitor.diagnosis.model import Diagnosis, FlightRecord, FrGroup, JobView

VERDICTS_HELPED = ("deadlock", "stalled")
# (FrGroup field, the word for it); the first that differs between ranks decides.
COUNTERS = (("last_enqueued", "enqueued"), ("last_completed", "completed"), ("last_started", "started"))
MAX_LINES = 8
PREFIX = "Flight Recorder"
LIVE_PATH = "torch worker server "


@dataclass(frozen=True)
class Finding:
    pg: str
    text: str
    # The ranks it names; the strongest finding of a job names its culprits.
    culprits: tuple[int, ...] = ()
    strength: int = 0  # 3: enqueued fewer, 2: disagree on a collective, 1: completed/started fewer
    hint: str | None = None


def fresh(job: JobView, since: float | None) -> dict[int, FlightRecord]:
    """The readable dumps written since the job stopped progressing, by rank."""
    return {
        r.rank: r.flight_recorder for r in job.ranks
        if r.flight_recorder is not None and r.flight_recorder.status == "ok"
        and (since is None or r.flight_recorder.dumped_at >= since)
    }


def by_group(dumps: dict[int, FlightRecord]) -> dict[str, dict[int, FrGroup]]:
    out: dict[str, dict[int, FrGroup]] = {}
    for rank, record in sorted(dumps.items()):
        for g in record.groups:
            out.setdefault(g.pg, {})[rank] = g
    return out


def compare(pg: str, groups: dict[int, FrGroup]) -> Finding | None:
    """What the dumps of one process group's ranks say, when two ranks or more dumped it."""
    if len(groups) < 2:
        return None
    for field, word in COUNTERS:
        values = {r: getattr(g, field) for r, g in groups.items() if getattr(g, field) is not None}
        if len(values) >= 2 and len(set(values.values())) > 1:
            return _behind(pg, groups, values, field, word)
        if field == "last_enqueued" and (found := _disagree(pg, groups)):
            # Before completions: a rank whose collective matches no other's does not complete it.
            return found
    return _together(pg, groups)


def _behind(pg: str, groups: dict[int, FrGroup], values: dict[int, int], field: str, word: str) -> Finding:
    low = min(values.values())
    behind = sorted(r for r, v in values.items() if v == low)
    ahead = sorted(r for r, v in values.items() if v != low)
    high = max(values.values())
    others = f"#{high}" if len({values[r] for r in ahead}) == 1 else f"up to #{high}"
    text = (f"{PREFIX}, pg {_pg(groups, pg)}: {ranks_text(behind)} last {word} {_seq(low, groups[behind[0]])} "
            f"while {ranks_text(ahead)} {word} {others}{_op(groups[max(ahead, key=values.get)], high)}")
    hint = (f"{ranks_text(behind)} stopped issuing collectives in pg {pg} after {_seq(low, groups[behind[0]])} "
            "while the others went on: look at what it does instead (its stack above), or for a collective the "
            "others run under a condition it does not meet.")
    return Finding(pg, text, tuple(behind), 3 if field == "last_enqueued" else 1, hint)


def _disagree(pg: str, groups: dict[int, FrGroup]) -> Finding | None:
    """Ranks at the same collective number, but not in the same collective."""
    seqs = {g.last_enqueued for g in groups.values()}
    seq = seqs.pop() if len(seqs) == 1 else None
    ops = {r: g.op_of(seq) for r, g in groups.items()}
    if seq is None or None in ops.values() or len(set(ops.values())) < 2:
        return None
    by_op: dict[str, list[int]] = {}
    for r, op in ops.items():
        by_op.setdefault(op, []).append(r)
    parts = "; ".join(f"{ranks_text(rs)} {op}" for op, rs in sorted(by_op.items(), key=lambda i: i[1]))
    common, count = Counter(ops.values()).most_common(1)[0]
    odd = tuple(sorted(r for r, op in ops.items() if op != common)) if count * 2 > len(ops) else ()
    hint = (f"The ranks ran different collectives as #{seq} of pg {pg}: look for a collective under a "
            "rank-dependent branch (`if rank == 0:`), or collectives issued in a different order per rank.")
    return Finding(pg, f"{PREFIX}, pg {_pg(groups, pg)}: the ranks disagree on collective #{seq}: {parts}", odd, 2,
                   hint)


def _together(pg: str, groups: dict[int, FrGroup]) -> Finding:
    g = next(iter(groups.values()))
    done = f", completed {_seq(g.last_completed, g)}" if g.last_completed is not None else ""
    return Finding(pg, f"{PREFIX}, pg {_pg(groups, pg)}: {ranks_text(groups)} all enqueued "
                       f"{_seq(g.last_enqueued, g)}{done}")


def findings(job: JobView, since: float | None) -> list[Finding]:
    found = [compare(pg, groups) for pg, groups in by_group(fresh(job, since)).items()]
    return [f for f in found if f is not None]


def _unused(job: JobView, since: float | None) -> list[str]:
    """Dumps there are but that say nothing: unreadable, or written before the job stopped."""
    lines = []
    for r in job.ranks:
        fr = r.flight_recorder
        if fr is None:
            continue
        if fr.status != "ok":
            lines.append(f"{PREFIX}: rank {r.rank}'s dump {fr.path} is {fr.status}")
        elif since is not None and fr.dumped_at < since:
            lines.append(f"{PREFIX}: rank {r.rank}'s dump was written {since - fr.dumped_at:.0f}s before the "
                         "job stopped: left out")
    return lines


def with_flight_recorder(
    job: JobView, result: Diagnosis, since: float | None, superseded: tuple[str, ...] = ()
) -> Diagnosis:
    """A deadlock or stall verdict with the Flight Recorder's findings as evidence, and its
    culprits when the verdict named none (``superseded``: the verdict's hints that guess at
    what the dumps tell, dropped once the dumps tell the ranks apart)."""
    if result.verdict not in VERDICTS_HELPED:
        return result
    found = findings(job, since)
    unused = _unused(job, since)
    if not found and not unused:
        return result
    evidence = [f.text for f in found][:MAX_LINES]
    dumps = fresh(job, since)
    if dumps:
        ages = sorted({round(job.now - d.dumped_at) for d in dumps.values()})
        span = f"{ages[0]}s" if len(ages) == 1 else f"{ages[0]}s to {ages[-1]}s"
        # A trace the agent read from a rank's torch worker server (agent/torch_worker_server.py) is live.
        live = all(d.path.startswith(LIVE_PATH) for d in dumps.values())
        how = "read live from their torch worker servers" if live else "written"
        evidence.append(f"{PREFIX} {'traces' if live else 'dumps'} of {ranks_text(dumps)} {how} {span} ago")
    evidence += unused[:MAX_LINES]
    strongest = max((f.strength for f in found), default=0)
    kept = tuple(h for h in result.hints if h not in superseded) if strongest else result.hints
    naming = max((f.strength for f in found if f.culprits), default=0)
    leads = [f for f in found if f.culprits and f.strength == naming]
    named = tuple(sorted({r for f in leads for r in f.culprits}))
    if result.culprit_ranks or not named:
        hints = [f.hint for f in found if f.hint and strongest and f.strength == strongest]
        return replace(result, evidence=(*result.evidence, *evidence), hints=(*kept, *dict.fromkeys(hints)))
    return replace(
        result,
        culprit_ranks=named,
        summary=f"{result.summary}; {leads[0].text}",
        evidence=(*result.evidence, *evidence),
        hints=(*dict.fromkeys(f.hint for f in leads if f.hint), *kept),
    )


def _pg(groups: dict[int, FrGroup], pg: str) -> str:
    desc = next((g.desc for g in groups.values() if g.desc), "")
    return f"{pg} ({desc})" if desc and desc != "default_pg" else pg


def _seq(seq: int | None, group: FrGroup) -> str:
    if seq is None or seq < 0:
        return "none"
    return f"#{seq}{_op(group, seq)}"


def _op(group: FrGroup, seq: int) -> str:
    op = group.op_of(seq)
    return f" ({op})" if op else ""
