"""Phases of a training job that legitimately pause step progress, read from stacks and logs.

A checkpoint save, an evaluation pass or a compilation holds progress for far
longer than a step; a rank seen in one gets a longer grace before a stall is
called (deadlock evidence is not affected).
"""

from __future__ import annotations

import re

from monitor.diagnosis.model import LogPhase, Stack
from monitor.diagnosis.stacks import memo

# Library frames that mean a phase wherever they show (file paths from the package root).
_LIBRARY_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("checkpoint", re.compile(r"^torch/serialization\.py$|^torch/distributed/checkpoint/|^safetensors/")),
    # Compiling, not running compiled code: eval_frame.py, output_code.py and the AOT
    # runtime wrappers are on every step of a compiled model.
    ("compilation", re.compile(
        r"^torch/_dynamo/(convert_frame|symbolic_convert|output_graph)\.py$"
        r"|^torch/_inductor/(compile_fx|graph|scheduler|lowering|async_compile|select_algorithm)\.py$"
        r"|^torch/_inductor/codegen/"
        r"|^torch/_functorch/_aot_autograd/(jit_compile_runtime_wrappers|dispatch_and_compile_graph)\.py$"
        r"|^triton/compiler/")),
)
# The user's own functions (never library frames: torch has eval_frame, inference_mode, ...).
_USER_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("checkpoint", re.compile(r"\b\w*(save|checkpoint|ckpt)\w*\b", re.IGNORECASE)),
    ("evaluation", re.compile(r"\b\w*(eval|valid|test_step|inference)\w*\b", re.IGNORECASE)),
)
# Trainer libraries' own entry points (Hugging Face Trainer, Lightning, accelerate, DeepSpeed),
# matched by exact name in library frames outside torch.
_TRAINER_FUNCTIONS: dict[str, frozenset[str]] = {
    "evaluation": frozenset({"evaluate", "evaluation_loop", "prediction_loop", "predict", "validate",
                             "validation_step", "test_step", "run_evaluation", "_evaluation_step"}),
    "checkpoint": frozenset({"save_checkpoint", "_save_checkpoint", "save_model", "save_pretrained",
                             "save_state", "save_file"}),
}
_TRAINER_FILES = re.compile(r"/loops/(evaluation|prediction)_loop\.py$")
_PHASE_ORDER = ("checkpoint", "evaluation", "compilation")
# Package roots whose source trees count as library code even outside site-packages.
_LIBRARY_ROOTS = ("torch", "triton")


def _library_path(frame) -> str | None:
    """The frame's path from its package root ("torch/_dynamo/eval_frame.py") when it is
    library code: installed, or a torch/triton source tree; None for the user's own code."""
    parts = frame.file.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    roots = [i for i, p in enumerate(parts[:-1]) if p in _LIBRARY_ROOTS]
    return "/".join(parts[roots[-1] :]) if roots else None


# A phase's first occurrence is allowed this long before its silence counts as a stall;
# a phase seen before may take twice its longest earlier run, if that is longer.
PHASE_GRACE_S = 120.0
PHASE_LONGEST_FACTOR = 2.0


def phase_grace_s(phase: str, longest_before: float | None) -> float:
    return max(PHASE_GRACE_S, PHASE_LONGEST_FACTOR * (longest_before or 0.0))


def phase_of(stack: Stack | None) -> str | None:
    """The phase the main thread's Python frames show, if any."""
    if stack is None:
        return None
    return memo(stack, "phase", lambda: _phase_of(stack))


def _phase_of(stack: Stack) -> str | None:
    found = set()
    for f in stack.frames:
        if f.native:
            continue
        short = _library_path(f)
        if short is not None:
            found.update(phase for phase, pattern in _LIBRARY_PHASES if pattern.search(short))
            if not short.startswith("torch/"):
                found.update(phase for phase, names in _TRAINER_FUNCTIONS.items() if f.name in names)
                if _TRAINER_FILES.search("/" + short):
                    found.add("evaluation")
        else:
            text = f"{f.name} {f.short_file}"
            found.update(phase for phase, pattern in _USER_PHASES if pattern.search(text))
    return next((p for p in _PHASE_ORDER if p in found), None)


def current_phase(fresh_stack: Stack | None, log_phase: LogPhase | None, last_progress_at: float | None) -> str | None:
    """The phase a rank is in now: its fresh stack says so, or its log announced one that
    no new step has ended (the agent drops a phase line once a new step follows it)."""
    phase = phase_of(fresh_stack)
    logged = fresh_log_phase(log_phase, last_progress_at)
    if phase is None and logged is not None:
        phase = logged.phase
    return phase


def fresh_log_phase(log_phase: LogPhase | None, last_progress_at: float | None) -> LogPhase | None:
    """The log's phase line when it was read with or after the job's last progress, else None."""
    # The agent reports a phase line only while no step followed it, so one read together
    # with the last step (the same timestamp) came after it.
    if log_phase is None or (last_progress_at is not None and log_phase.seen_at < last_progress_at):
        return None
    return log_phase
