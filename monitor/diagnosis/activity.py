"""What each rank is doing right now, from its latest snapshot.

A stack only counts when it is fresh: taken after ``fresh_after`` (the job's
last progress), so a background dump from a healthy moment is never read as
the rank's current position.
"""

from __future__ import annotations

from typing import NamedTuple

from monitor.diagnosis.model import RankView
from monitor.diagnosis.phases import current_phase, phase_of
from monitor.diagnosis.stacks import WaitPoint, top_frame_text, wait_point

# Two ranks sharing a core each show ~50%; a rank waiting or sleeping stays near 0-15%.
BUSY_CPU_PERCENT = 25.0
# wchar rate above which a rank is moving data (log lines stay far below; a 2 Mbit/s link
# carries ~250 KB/s, so the bar sits well under that).
MOVING_BYTES_PER_S = 64 * 1024
# A send queue at least this deep that changed between two reports is bytes leaving the rank: a
# throttled link drains a collective's buffered megabytes for seconds with no new write, while a
# deadlocked rank's queues stay empty (or full and still, when its peer no longer reads). Well over
# the few bytes a store heartbeat leaves queued for a moment.
MOVING_QUEUE_BYTES = 64 * 1024
# A stop seen in two reports (about 2 s apart) is not a passing pause. A tracing stop
# ("t") is what py-spy's own dumps cause, so it must last much longer to count.
STOPPED_CONFIRM_S = 1.5
# A rank that moved data this recently is still writing or sending: checkpoints are written
# in bursts (write, fsync, pause) and a throttled link sends in bursts too.
MOVING_WINDOW_S = 2.5
TRACE_STOP_CONFIRM_S = 10.0

ACTIVITIES = (
    "exited",
    "failed",
    "stopped",
    "in_collective",
    "sending",
    "rendezvous",
    "computing",
    "writing",
    "idle",
    "unknown",
)


class Activity(NamedTuple):
    """What one rank is doing. A named tuple, not a frozen dataclass: a pass makes one per rank, 100,000
    for a giant job, and a tuple is made in C (a fifth of the time)."""

    rank: RankView
    kind: str  # one of ACTIVITIES
    wait: WaitPoint | None = None
    top_frame: str | None = None
    # Whether a stack taken since the job's last progress says where the rank is.
    stack_fresh: bool = False
    # A phase that pauses progress (evaluation, checkpoint, compilation), from the fresh
    # stack or from a log line read since the last progress; None when neither says so.
    phase: str | None = None

    @property
    def waiting(self) -> bool:
        return self.kind in ("in_collective", "sending")

    @property
    def busy(self) -> bool:
        return self.kind in ("computing", "writing")


def is_stopped(rank: RankView) -> bool:
    if not rank.alive or rank.proc_state not in ("T", "t"):
        return False
    since = rank.state_since if rank.state_since is not None else rank.observed_at
    confirm = STOPPED_CONFIRM_S if rank.proc_state == "T" else TRACE_STOP_CONFIRM_S
    return rank.observed_at - since >= confirm


# A rank at idle CPU, nothing written, this long in one place (its stacks unchanged, or the kernel's
# disk wait) is stuck, whatever phase its frames show (diagnosis.held): the "30 s", timed from
# when it went idle, so the verdict, confirmed, lands before 30 s.
STUCK_IO_S = 25.0


def disk_wait_since(rank: RankView) -> float | None:
    """Since when the rank has sat in the kernel's disk wait (D) at idle CPU with no bytes moving, or
    None. A hard NFS or Lustre mount that does not answer leaves its callers here, and py-spy cannot
    stop them to take a stack."""
    if not rank.alive or rank.proc_state != "D" or rank.state_since is None or rank.idle_since is None:
        return None
    return max(rank.state_since, rank.idle_since)


def moving_data(rank: RankView) -> bool:
    """Writing or sending now, or within MOVING_WINDOW_S of its latest report."""
    if (rank.write_bytes_per_s or 0.0) >= MOVING_BYTES_PER_S:
        return True
    return rank.moved_at is not None and rank.observed_at - rank.moved_at <= MOVING_WINDOW_S


def classify(rank: RankView, fresh_after: float | None) -> Activity:
    stack = rank.stack
    if stack is not None and fresh_after is not None and stack.taken_at < fresh_after:
        stack = None
    top_text = top_frame_text(stack)
    if not rank.alive:
        failed = rank.exit is not None and rank.exit.failed
        return Activity(rank, "failed" if failed else "exited", top_frame=top_text)
    if is_stopped(rank):
        return Activity(rank, "stopped", top_frame=top_text)
    point = wait_point(stack, rank.cpu_percent)
    if point is not None:
        if point.is_rendezvous:
            return Activity(rank, "rendezvous", point, top_text)
        return Activity(rank, "sending" if moving_data(rank) else "in_collective", point, top_text)
    fresh = stack is not None
    phase = current_phase(stack, rank.log_phase, fresh_after)
    if rank.cpu_percent is not None and rank.cpu_percent >= BUSY_CPU_PERCENT:
        return Activity(rank, "computing", top_frame=top_text, stack_fresh=fresh, phase=phase)
    # Busy without CPU: writing a checkpoint or waiting on the disk, until that wait has lasted
    # STUCK_IO_S with nothing written (then it is idle where it sits: stuck, diagnosis.held).
    disk_wait = disk_wait_since(rank)
    stuck_on_disk = disk_wait is not None and rank.observed_at - disk_wait >= STUCK_IO_S
    if moving_data(rank) or (rank.proc_state == "D" and not stuck_on_disk):
        return Activity(rank, "writing", top_frame=top_text, stack_fresh=fresh, phase=phase)
    if stuck_on_disk:
        return Activity(rank, "idle", top_frame=top_text, stack_fresh=fresh, phase=phase)
    if stack is not None:
        # An idle rank's fresh stack outweighs its log: a phase line does not excuse a
        # rank parked outside any phase (say, one that left the loop after "eval done").
        return Activity(rank, "idle", top_frame=top_text, stack_fresh=True, phase=phase_of(stack))
    return Activity(rank, "unknown", top_frame=top_text, phase=phase)
