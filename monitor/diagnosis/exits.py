"""Which ended rank caused the others to end.

With gloo, the peers of a dead rank fail at once with "Connection closed by
peer", and torchrun then terminates the survivors with SIGTERM: those endings
are consequences. The cause is the earliest ending that is not one of them.
"""

from __future__ import annotations

import re
import signal as signals

from monitor.diagnosis.model import RankView

# Errors a rank gets because a peer went away, not because of its own fault.
PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|"
    r"Connection refused|NCCL communicator was aborted|peer.*(closed|gone|lost)|"
    r"DistBackendError|Socket Timeout",
    re.IGNORECASE,
)
# How close two endings must be to count as "at the same time". Exit times come from
# pidfd wake-ups (millisecond-exact), and peers of a dead gloo rank end 0.1-0.7 s
# later, sometimes before their "Connection reset" line has been read from the log.
SAME_MOMENT_S = 0.05
# A SIGTERM this long after another rank's end is the launcher's teardown (exit times of one
# node are pidfd-exact; across nodes they carry the millisecond jitter of the clock shift).
TEARDOWN_AFTER_S = 0.005


def is_consequence(rank: RankView, first_end: float) -> bool:
    exit_ = rank.exit
    if exit_ is None:
        return False
    if exit_.error and PEER_LOST.search(exit_.error):
        return True
    if rank.error_file_message and PEER_LOST.search(rank.error_file_message):
        return True
    # SIGTERM/SIGINT after another rank ended: the launcher tearing the group down. torchrun
    # polls its workers every 0.1 s, so its SIGTERM can follow the first end by 10-30 ms.
    return exit_.signal in (signals.SIGTERM, signals.SIGINT) and exit_.at > first_end + TEARDOWN_AFTER_S


def first_causes(ended: list[RankView]) -> list[RankView]:
    """The rank(s) that ended first and not because a peer ended."""
    timed = sorted(ended, key=lambda r: r.exit.at if r.exit else float("inf"))
    first_end = timed[0].exit.at if timed and timed[0].exit else float("inf")
    causes = [r for r in timed if not is_consequence(r, first_end)]
    if not causes:
        causes = timed[:1]
    earliest = causes[0].exit.at if causes[0].exit else float("inf")
    return [r for r in causes if r.exit is None or r.exit.at - earliest <= SAME_MOMENT_S] or causes[:1]


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(rank: RankView) -> str:
    exit_ = rank.exit
    where = f"rank {rank.rank} (pid {rank.pid} on {rank.node})"
    if exit_ is None:
        return f"{where} vanished; exit status unknown"
    if exit_.signal:
        how = f"killed by {signal_name(exit_.signal)}"
    elif exit_.code is not None:
        how = f"exited with code {exit_.code}"
    else:
        how = "ended (exit status unknown)"
    text = f"{where} {how}"
    detail = error_detail(rank)
    if detail:
        text += f": {detail}"
    return text


def error_detail(rank: RankView) -> str | None:
    """The rank's own error: its error file (``@record``) says more than a log line."""
    if rank.error_file_message:
        lines = [ln.strip() for ln in rank.error_file_message.strip().splitlines() if ln.strip()]
        if lines:
            return f"{lines[0]} (from its error file)"
    return rank.exit.error if rank.exit else None
