"""Inputs and outputs of the diagnosis: plain, immutable values.

The monitor turns its stored reports into a ``JobView`` (times already on the
monitor's clock) and calls ``diagnose(job)``; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal[
    "healthy",
    "deadlock",
    "straggler",
    "slow_compute",
    "rank_exited",
    "rank_stopped",
    "rendezvous_hang",
    "stalled",
    "finished",
]

VERDICTS: tuple[str, ...] = Verdict.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Frame:
    name: str
    file: str = ""
    line: int | None = None
    native: bool = False

    @property
    def short_file(self) -> str:
        """The path from the package root on (``torch/distributed/...``), else the base name."""
        parts = self.file.replace("\\", "/").split("/")
        for marker in ("site-packages", "dist-packages"):
            if marker in parts:
                return "/".join(parts[parts.index(marker) + 1 :])
        return parts[-1] if parts else ""

    def where(self) -> str:
        if self.native or not self.file:
            return self.name
        line = f":{self.line}" if self.line is not None else ""
        return f"{self.name} ({self.short_file}{line})"


@dataclass(frozen=True)
class Stack:
    taken_at: float
    # Main thread, innermost frame first.
    frames: tuple[Frame, ...]
    native: bool = False
    # py-spy's view of the main thread: False = idle (waiting), True = running.
    active: bool | None = None


@dataclass(frozen=True)
class ExitView:
    at: float
    code: int | None = None
    signal: int | None = None
    # The last error this rank printed (e.g. "RuntimeError: ... Connection closed by peer").
    error: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.signal) or (self.code not in (0, None)) or self.error is not None


@dataclass(frozen=True)
class RankView:
    rank: int
    node: str
    pid: int | None
    alive: bool
    observed_at: float
    first_seen_at: float
    exit: ExitView | None = None
    # Kernel state letter (R S D T t Z), and since when the rank has been in it.
    proc_state: str | None = None
    state_since: float | None = None
    cpu_percent: float | None = None
    # Since when CPU has stayed below the idle threshold without a break (None: it is not).
    idle_since: float | None = None
    write_bytes_per_s: float | None = None
    step: int | None = None
    # Progress seen in this rank's own log lines, oldest first (monitor clock).
    progress_times: tuple[float, ...] = ()
    stack: Stack | None = None
    stack_error: str | None = None
    log_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostFacts:
    cpu_flags: frozenset[str] = frozenset()
    cpu_model: str = ""


@dataclass(frozen=True)
class JobView:
    job_id: str
    world_size: int
    now: float
    first_seen_at: float
    ranks: tuple[RankView, ...]
    # Progress seen in job-level logs (a rank-0-only log, unprefixed shared lines).
    job_progress_times: tuple[float, ...] = ()
    job_step: int | None = None
    # Collective call sites ("all_reduce@train.py:50") seen while the job progressed:
    # the job's regular sync points, used to tell the odd one out.
    known_wait_sites: frozenset[str] = frozenset()
    hosts: dict[str, HostFacts] = field(default_factory=dict)
    # Whether stacks can be taken at all on the nodes of this job (py-spy present and permitted).
    stacks_unavailable_reason: str | None = None


RankState = Literal[
    "running",  # advancing normally
    "computing",  # busy (high CPU), not waiting on peers
    "in_collective",  # parked in a collective, waiting on peers
    "sending",  # in a collective with bytes still moving
    "rendezvous",  # initialising the process group / rendezvous
    "idle",  # low CPU, not in a collective (sleeping, blocked on I/O, lingering)
    "stopped",  # SIGSTOP / job control / tracer stop
    "exited",  # ended with exit code 0
    "failed",  # ended with an error, a non-zero code or a signal
    "unknown",  # not enough data yet
]


@dataclass(frozen=True)
class RankDiagnosis:
    rank: int
    state: str
    top_frame: str | None = None
    # Where it waits, e.g. "all_reduce@train.py:50"; None when not in a collective.
    wait_site: str | None = None


@dataclass(frozen=True)
class WaitGroup:
    """Ranks that wait at the same place (collective kind and call site)."""

    site: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Diagnosis:
    verdict: str
    culprit_ranks: tuple[int, ...]
    since: float | None
    summary: str
    evidence: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    ranks: tuple[RankDiagnosis, ...] = ()
    groups: tuple[WaitGroup, ...] = ()
