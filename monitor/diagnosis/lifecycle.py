"""Rules about ranks that ended or are stopped: these explain everything their peers do."""

from __future__ import annotations

from monitor.diagnosis.activity import Activity, classify, is_stopped
from monitor.diagnosis.context import RANK_LINES_MAX, Context, describe_all, ranks_text, where
from monitor.diagnosis.errors import hints_for_errors
from monitor.diagnosis.exits import describe_exit, error_detail, first_causes
from monitor.diagnosis.model import Diagnosis
from monitor.diagnosis.rendezvous import interface_findings

# A clean exit while peers live only matters once the peers wait this long after it.
HELD_UP_AFTER_EXIT_S = 2.0


def ended_ranks(ctx: Context) -> Diagnosis | None:
    ended = [a for a in ctx.activities.values() if not a.rank.alive]
    if not ended:
        return None
    live = ctx.live()
    any_failed = any(a.rank.exit is not None and a.rank.exit.failed for a in ended)
    if not live and not any_failed:
        last = max((a.rank.exit.at for a in ended if a.rank.exit), default=None)
        return ctx.diagnosis(
            "finished", (), last, f"all {len(ended)} ranks ended normally",
            evidence=_capped([describe_exit(a.rank) for a in sorted(ended, key=lambda a: a.rank.rank)]),
        )
    if live and not any_failed and not _live_ranks_held_up(ctx, ended, live):
        return None  # the others may still be finishing their last steps
    causes = first_causes([a.rank for a in ended])
    timed = [r.exit.at for r in causes if r.exit]
    first_at = min(timed) if timed else None
    culprits = [r.rank for r in causes]
    in_order = sorted((a.rank for a in ended), key=lambda r: r.exit.at if r.exit else 0.0)
    evidence = _capped([describe_exit(r) for r in in_order])
    evidence += describe_all(live, " (still alive)")
    summary = f"{ranks_text(culprits)} ended first"
    if live:
        summary += f"; {ranks_text(a.rank.rank for a in live)} left waiting"
    elif len(ended) > len(culprits):
        summary += "; the other ranks failed because of it"
    # A rank that died connecting to a peer often points at the peer's network settings.
    if_evidence, if_hints, _ = interface_findings(ctx, [a.rank for a in ctx.activities.values()])
    evidence += if_evidence
    hints = hints_for_errors(error_detail(r) for r in causes)
    hints += [h for h in if_hints if h not in hints]
    hints += [
        f"Look at why {ranks_text(culprits)} ended: its own error or exit status above is the cause; "
        "'Connection closed/reset by peer' errors on the other ranks are consequences (torchrun's "
        "'Root Cause' may name one of those).",
        "A rank that leaves the training loop early (uneven data per rank) ends the job: give every "
        "rank the same number of batches (DistributedSampler(drop_last=True)) or agree on stopping "
        "with an all_reduce of a 'done' flag.",
    ]
    if any(r.exit and r.exit.signal == 9 for r in causes):
        hints.append("SIGKILL with no traceback is often the kernel's OOM killer: check `dmesg` on that node.")
    if any(r.exit and r.exit.failed and not error_detail(r) and not r.exit.signal for r in causes):
        hints.append(
            "No error text was captured: decorate the entry point with "
            "torch.distributed.elastic.multiprocessing.errors.record so the rank writes its traceback "
            "to TORCHELASTIC_ERROR_FILE."
        )
    return ctx.diagnosis("rank_exited", culprits, first_at, summary, evidence, hints)


def _live_ranks_held_up(ctx: Context, ended: list[Activity], live: list[Activity]) -> bool:
    """Clean exits only matter when the ranks still alive stopped progressing or wait on peers."""
    if ctx.cadence.is_stalled(ctx.now):
        return True
    first_exit = min((a.rank.exit.at for a in ended if a.rank.exit), default=None)
    if first_exit is None:
        return False
    fresh = [classify(a.rank, first_exit) for a in live]
    return any(a.waiting for a in fresh) and ctx.now - first_exit > HELD_UP_AFTER_EXIT_S


def stopped_ranks(ctx: Context) -> Diagnosis | None:
    stopped = [a for a in ctx.live() if is_stopped(a.rank)]
    if not stopped:
        return None
    since = min(a.rank.state_since or a.rank.observed_at for a in stopped)
    evidence = [
        f"rank {a.rank.rank} (pid {a.rank.pid} on {a.rank.node}) is in kernel state "
        f"{a.rank.proc_state} (stopped) for {ctx.now - (a.rank.state_since or ctx.now):.0f}s"
        for a in stopped
    ]
    evidence += [f"rank {a.rank.rank}: {a.kind}, {where(a)}" for a in ctx.live() if a not in stopped]
    pids = " ".join(str(a.rank.pid) for a in stopped if a.rank.pid)
    hints = [
        f"Resume it with `kill -CONT {pids}` if nobody is debugging it.",
        "Look for what stopped it: job control (Ctrl-Z in the launching shell), a debugger or "
        "tracer (`grep TracerPid /proc/PID/status`), or a script sending SIGSTOP.",
    ]
    culprits = [a.rank.rank for a in stopped]
    return ctx.diagnosis(
        "rank_stopped", culprits, since, f"{ranks_text(culprits)} stopped; the others wait for it",
        evidence, hints,
    )


def _capped(lines: list[str]) -> list[str]:
    """The first RANK_LINES_MAX lines (the earliest exits come first), and how many more there were."""
    if len(lines) <= RANK_LINES_MAX:
        return lines
    return lines[:RANK_LINES_MAX] + [f"... and {len(lines) - RANK_LINES_MAX} more ranks ended"]
