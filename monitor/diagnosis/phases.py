"""Phases of a training job that legitimately pause step progress, read from stacks.

A checkpoint save, an evaluation pass or a compilation holds progress for far
longer than a step; a rank seen in one gets a longer grace before a stall is
called (deadlock evidence is not affected).
"""

from __future__ import annotations

import re

from monitor.diagnosis.model import Stack

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
