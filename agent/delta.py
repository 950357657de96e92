"""Delta reports: after a delivered full report, send only what changed since the last delivery.

Most of a report repeats itself second after second: the latest stack of each rank (re-sent
until the next dump), the recent progress points, the node's host facts, sockets, launch
settings and command lines. A monitor that keeps its picture per node (every monitor that
answers ``"delta": true``) needs them once. This module turns the runner's full report into
the smallest report that leaves the monitor with the same picture:

- the host facts are ``null`` when unchanged, and so is NCCL's RAS answer (``nccl_ras``: it
  changes with every poll of the service, every few seconds, not every report);
- per rank (keyed by job, rank and pid): the stack is left out when the monitor has that dump
  already; progress points the monitor has are left out of ``recent``; ``sockets`` is
  ``null`` when unchanged, and so is ``flight_recorder`` (the rank's latest dump: it changes
  when the job writes a new one); ``env`` and ``cmdline`` are empty when unchanged (the monitor
  keeps the last non-empty one).

Rates over the interval (``cpu_percent``, ``write_bytes_per_s``, ``sched``: the CPU a rank was
denied) are sent in every report, changed or not: they say what the last interval was like.

The baseline moves only on delivery, and every delta is taken against the last report the
monitor acknowledged: it carries everything that changed since, so it is right whether or not
the posts in between landed (the monitor drops stacks and progress points it already has).
A failed post, a refusal or a monitor shedding load therefore never costs a full report, which
would add load exactly when the monitor has too much. A monitor that lost the node's picture
(a restart, a forgotten node) or wants a snapshot answers ``"send_full": true`` until it gets one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RankKey = tuple[str, int, int]  # (job_id, rank, pid)


@dataclass
class _Sent:
    """What the monitor holds of one rank, as of the last delivered report."""

    stack_taken_at: float | None = None
    progress_mark: float | None = None
    sockets: list | None = None
    env: dict | None = None
    cmdline: str | None = None
    flight_recorder: dict | None = None


@dataclass
class DeltaState:
    # Turned on by the monitor's first answer that says it takes deltas.
    monitor_takes_deltas: bool = False
    _host: dict | None = None
    _nccl_ras: dict | None = None
    _ranks: dict[RankKey, _Sent] = field(default_factory=dict)
    _full_due: bool = True

    def compact(self, report: dict) -> tuple[dict, dict]:
        """(the report to send, the baseline to adopt if the monitor takes it)."""
        baseline = _baseline_of(report)
        if not self.monitor_takes_deltas or self._full_due:
            return report, baseline
        out = dict(report, delta=True)
        if report.get("host") == self._host:
            out["host"] = None
        if report.get("nccl_ras") is not None and report["nccl_ras"] == self._nccl_ras:
            out["nccl_ras"] = None
        out["ranks"] = [self._compact_rank(r) for r in report.get("ranks", [])]
        return out, baseline

    def delivered(self, baseline: dict, answer: dict | None) -> None:
        """The monitor took the report built with ``baseline``; ``answer`` is its JSON reply."""
        answer = answer or {}
        self.monitor_takes_deltas = bool(answer.get("delta"))
        self._host = baseline["host"]
        self._nccl_ras = baseline["nccl_ras"]
        self._ranks = baseline["ranks"]
        self._full_due = bool(answer.get("send_full"))

    def reset(self) -> None:
        """Forget what the monitor holds (another monitor now): the next report is full."""
        self.monitor_takes_deltas = False
        self._full_due = True

    def _compact_rank(self, rank: dict) -> dict:
        sent = self._ranks.get(_key(rank))
        if sent is None:
            return rank
        out = dict(rank)
        stack = rank.get("stack")
        if stack is not None and stack.get("taken_at") == sent.stack_taken_at:
            out["stack"] = None
        progress = rank.get("progress")
        if progress is not None and sent.progress_mark is not None:
            recent = [p for p in progress.get("recent", []) if p[0] > sent.progress_mark]
            out["progress"] = dict(progress, recent=recent)
        if rank.get("sockets") == sent.sockets:
            out["sockets"] = None
        if rank.get("env") == sent.env:
            out["env"] = {}
        if rank.get("cmdline") == sent.cmdline:
            out["cmdline"] = ""
        if rank.get("flight_recorder") == sent.flight_recorder:
            out["flight_recorder"] = None  # the agent never takes a dump back: null is "unchanged"
        return out


def _key(rank: dict) -> RankKey:
    return (rank.get("job_id", ""), rank.get("rank", -1), rank.get("pid", -1))


def _baseline_of(report: dict) -> dict:
    ranks: dict[RankKey, _Sent] = {}
    for rank in report.get("ranks", []):
        progress = rank.get("progress") or {}
        recent = progress.get("recent") or []
        stack = rank.get("stack")
        ranks[_key(rank)] = _Sent(
            stack_taken_at=stack.get("taken_at") if stack else None,
            progress_mark=max((p[0] for p in recent), default=None),
            sockets=rank.get("sockets"),
            env=rank.get("env"),
            cmdline=rank.get("cmdline"),
            flight_recorder=rank.get("flight_recorder"),
        )
    return {"host": report.get("host"), "nccl_ras": report.get("nccl_ras"), "ranks": ranks}
