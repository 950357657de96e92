"""Phases of a training job that legitimately pause step progress, read from stacks and logs.

A checkpoint save, an evaluation pass or a compilation holds progress for far
longer than a step; a rank seen in one gets a longer grace before a stall is
called (deadlock evidence is not affected).
"""

from __future__ import annotations

import re

from monitor.diagnosis.model import LogPhase, Stack

# (phase, pattern on "function file") checked over the main thread's Python frames.
_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("checkpoint", re.compile(r"torch/serialization\.py|torch/distributed/checkpoint|"
                              r"\b\w*(save|checkpoint|ckpt)\w*\b", re.IGNORECASE)),
    ("evaluation", re.compile(r"\b\w*(eval|valid|test_step|inference)\w*\b", re.IGNORECASE)),
    ("compilation", re.compile(r"torch/_dynamo|torch/_inductor|torch/_functorch|triton/compiler")),
)

# A phase's first occurrence is allowed this long before its silence counts as a stall.
PHASE_GRACE_S = 120.0


def phase_of(stack: Stack | None) -> str | None:
    if stack is None:
        return None
    texts = [f"{f.name} {f.short_file}" for f in stack.frames if not f.native]
    for phase, pattern in _PHASES:
        if any(pattern.search(t) for t in texts):
            return phase
    return None


def current_phase(fresh_stack: Stack | None, log_phase: LogPhase | None, last_progress_at: float | None) -> str | None:
    """The phase a rank is in now: its fresh stack says so, or a log line read after the
    job's last progress announced it (an "eval ..." line printed with a step counts only
    once no step follows it)."""
    phase = phase_of(fresh_stack)
    logged = fresh_log_phase(log_phase, last_progress_at)
    if phase is None and logged is not None:
        phase = logged.phase
    return phase


def fresh_log_phase(log_phase: LogPhase | None, last_progress_at: float | None) -> LogPhase | None:
    """The log's phase line when it was read after the job's last progress, else None."""
    if log_phase is None or (last_progress_at is not None and log_phase.seen_at <= last_progress_at):
        return None
    return log_phase
