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

After a restart every node owes the monitor a full report at once. The monitor spreads them: its
answer says when (``"full_in_s"``, monitor/ingest/full_pacing.py), and deltas go on until then.
After an outage the deltas go on from the last report the agent kept and the monitor took
(``adopt``): a restarted monitor asks for the full report and paces it like any other. A monitor
that asks without saying when (an older one), and one that takes no kept reports
(``reset(spread=True)``), get the full report spread by the agent itself: the sender holds it a
random part of an interval (``take_spread_s``), so a fleet that lost one monitor together does
not send them together.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# The longest wait for a full report taken from a monitor's answer (it asks for 10 s at most):
# past it, the full report goes anyway; the monitor reads the node as stale until it has one.
MAX_FULL_IN_S = 60.0
# The longest the agent holds a full report to spread it (a random part of its interval).
MAX_SPREAD_S = 10.0

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
    # The owed full report goes once ``clock()`` reaches this (deltas until then).
    _full_at: float = 0.0
    # How long the sender holds the owed full report, once (take_spread_s).
    _spread_s: float = 0.0
    # The agent's report interval, read from its reports: the spread is a random part of one.
    _interval_s: float = 1.0
    _warned: bool = False  # of a monitor's wait that is not one (logged once)
    clock: Callable[[], float] = time.monotonic
    rng: Callable[[], float] = random.random

    def compact(self, report: dict) -> tuple[dict, dict]:
        """(the report to send, the baseline to adopt if the monitor takes it)."""
        baseline = _baseline_of(report)
        interval = (report.get("agent") or {}).get("interval_s")
        if isinstance(interval, (int, float)) and interval > 0:
            self._interval_s = min(float(interval), MAX_SPREAD_S)
        if not self.monitor_takes_deltas or (self._full_due and self.clock() >= self._full_at):
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
        self._full_at, self._spread_s = 0.0, 0.0
        if not self._full_due:
            return
        if "full_in_s" in answer:
            self._full_at = self.clock() + self._full_in_s(answer["full_in_s"])
        else:  # a monitor that does not pace full reports
            self._spread_s = self.rng() * self._interval_s

    def adopt(self, report: dict, answer: dict | None) -> None:
        """The monitor took ``report`` whole (a full report kept through an outage, replayed) and answered
        ``answer``: its picture of the node is that report now, and deltas go on from it."""
        self.delivered(_baseline_of(report), answer)

    def reset(self, spread: bool = False) -> None:
        """Forget what the monitor holds (another monitor now): the next report is full. ``spread``:
        after an outage, when every agent of the fleet comes back to the monitor within seconds."""
        self.monitor_takes_deltas = False
        self._full_due = True
        self._full_at = 0.0
        self._spread_s = self.rng() * self._interval_s if spread else 0.0

    def take_spread_s(self) -> float:
        """Seconds to hold the next post, a full report being spread (0: send now); said once."""
        spread, self._spread_s = self._spread_s, 0.0
        return spread

    def _full_in_s(self, value: object) -> float:
        """The wait a monitor's answer asks for, bounded; a value that is not one is read as 0 (logged once)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            if not self._warned:
                self._warned = True
                log.warning("monitor answered full_in_s=%.50r, not a number of seconds >= 0: sending full reports "
                            "when asked, at once", value)
            return 0.0
        return min(float(value), MAX_FULL_IN_S)

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
