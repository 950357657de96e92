"""Pure line parsers for training logs: progress lines, rank prefixes, tracebacks, and
torchrun's failure block. No I/O here; every function is tested on log text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# torchrun --tee/--redirects prefixes lines with "[defaultN]:" where N is the LOCAL
# rank (checked with a two-node torchrun: global rank 1 on node 1 printed "[default0]:");
# torch.distributed's excepthook prefixes traceback lines with "[rankN]:" (global rank).
PREFIX = re.compile(r"^\[(default|rank)(\d+)\]:\s?")


@dataclass(frozen=True)
class Prefixed:
    rank: int | None  # global rank from "[rankN]:"
    local_rank: int | None  # from "[defaultN]:"
    text: str  # the line without prefixes


def json_object(text: str) -> dict | None:
    """``text`` as a JSON object, or None when it is not one (a JSON-lines log, an error file)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def split_prefixes(line: str) -> Prefixed:
    rank = local_rank = None
    while m := PREFIX.match(line):
        if m.group(1) == "rank":
            rank = int(m.group(2))
        else:
            local_rank = int(m.group(2))
        line = line[m.end() :]
    return Prefixed(rank, local_rank, line)


@dataclass(frozen=True)
class Progress:
    step: int
    total: int | None
    pattern: str


# Order matters: the specific formats come before the generic "step N".
BUILTIN_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # nanochat: "step 00004/05000 (0.08%) | loss: 10.4 | ..."
    ("nanochat", re.compile(r"\bstep (?P<step>\d+)/(?P<total>\d+)\b")),
    # Megatron-LM: " iteration      100/    1000 | consumed samples: ..."
    ("megatron", re.compile(r"\biteration\s+(?P<step>\d+)/\s*(?P<total>\d+)\s*\|")),
    # torchtitan: "step: 10  loss:  7.9 ..." (colour codes stripped first)
    ("torchtitan", re.compile(r"\bstep:\s*(?P<step>\d+)\s+loss")),
    # tqdm bars (Hugging Face Trainer, Lightning): " 45/100 [00:05<00:06,  8.50it/s"
    ("tqdm", re.compile(r"(?P<step>\d+)/(?P<total>\d+)\s*\[\d+:\d+(?::\d+)?<")),
    # generic: "step 12", "step=12", "Step: 12", "global_step=12"
    ("generic", re.compile(r"\b(?:global_)?step\s*[=:]?\s*(?P<step>\d+)\b", re.IGNORECASE)),
)


def compile_user_pattern(regex: str) -> re.Pattern[str]:
    """The user's --step-regex: named group "step" or else the first group."""
    pattern = re.compile(regex)
    if "step" not in pattern.groupindex and pattern.groups < 1:
        raise ValueError("the step regex needs a group: (?P<step>\\d+) or (\\d+)")
    return pattern


def match_progress(line: str, user: re.Pattern[str] | None = None) -> Progress | None:
    text = ANSI.sub("", line)
    candidates = (("user", user),) if user is not None else ()
    for name, pattern in candidates + BUILTIN_PATTERNS:
        m = pattern.search(text)
        if not m:
            continue
        groups = m.groupdict()
        raw_step = groups.get("step") if "step" in groups else m.group(1)
        try:
            step = int(raw_step)
        except (TypeError, ValueError):
            continue
        total = groups.get("total")
        return Progress(step, int(total) if total else None, name)
    return None


# After a traceback's indented frames: "ValueError: bad shape", "KeyboardInterrupt".
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")


class TracebackTracker:
    """Feeds lines of one writer; returns the final "SomeError: message" line of a traceback."""

    def __init__(self) -> None:
        self.inside = False

    def feed(self, text: str) -> str | None:
        if text.startswith("Traceback (most recent call last)"):
            self.inside = True
            return None
        if not self.inside or not text.strip() or text[0] in " \t":
            return None
        if text.startswith(("During handling of the above", "The above exception")):
            return None
        self.inside = False
        return text.rstrip() if ERROR_LINE.match(text) else None


@dataclass(frozen=True)
class LauncherFailure:
    pid: int
    exitcode: int
    rank: int | None = None
    local_rank: int | None = None


# The failure block torchrun prints:   "  rank      : 1 (local_rank: 1)"
#                                      "  exitcode  : -9 (pid: 1234)"
BLOCK_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
BLOCK_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
# and its log line: "... failed (exitcode: -9) local_rank: 1 (pid: 3108) of binary: ..."
FAILED_LINE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")


class LauncherBlockParser:
    """Feeds unprefixed lines of a launcher log; returns a LauncherFailure when one is complete."""

    def __init__(self) -> None:
        self._rank: tuple[int, int] | None = None

    def feed(self, text: str) -> LauncherFailure | None:
        if m := FAILED_LINE.search(text):
            return LauncherFailure(int(m.group(3)), int(m.group(1)), None, int(m.group(2)))
        if m := BLOCK_RANK.match(text):
            self._rank = (int(m.group(1)), int(m.group(2)))
            return None
        if m := BLOCK_EXIT.match(text):
            rank, local = self._rank or (None, None)
            self._rank = None
            return LauncherFailure(int(m.group(2)), int(m.group(1)), rank, local)
        return None


# --- the compute dtype a log announces ----------------------------------------------------

_DTYPE_NAMES = {
    "bfloat16": "torch.bfloat16",
    "bf16": "torch.bfloat16",
    "bf16-mixed": "torch.bfloat16",
    "bf16-true": "torch.bfloat16",
    "float16": "torch.float16",
    "fp16": "torch.float16",
    "half": "torch.float16",
    "16bit": "torch.float16",
    "16-mixed": "torch.float16",
    "float32": "torch.float32",
    "fp32": "torch.float32",
    "float": "torch.float32",
    "32bit": "torch.float32",
    "32-true": "torch.float32",
}
_DTYPE_WORD = r"(?:torch\.)?(?:bfloat16|bf16(?:-mixed|-true)?|float16|fp16|half|16bit|16-mixed|float32|fp32|float|32bit|32-true)"
# Most specific first. Word boundaries keep "avx512_bf16" (a CPU flag) and tensor
# reprs ("tensor([...], dtype=torch.int64)") from counting.
DTYPE_PATTERNS = (
    # nanochat: "COMPUTE_DTYPE: torch.bfloat16 (auto-detected: CUDA SM 89)"; "dtype=torch.bfloat16",
    # "torch_dtype=torch.float16", "--dtype bf16", "--dtype=float32", "dtype: bf16"
    re.compile(rf"(?:compute_|torch_|param_|autocast_|amp_|\b|--)dtype\b['\"]?\s*[:=]?\s*['\"]?(?P<d>{_DTYPE_WORD})(?![\w-]|\.\w)", re.I),
    # "using bfloat16", "Using bfloat16 Automatic Mixed Precision (AMP)" (Lightning), "using fp16"
    re.compile(rf"\busing\s+(?P<d>{_DTYPE_WORD})(?![\w-]|\.\w)", re.I),
    # accelerate / Lightning settings: "mixed_precision=bf16", "precision=bf16-mixed", "precision: 16-mixed"
    re.compile(rf"\b(?:mixed_)?precision['\"]?\s*[:=]\s*['\"]?(?P<d>{_DTYPE_WORD})(?![\w-]|\.\w)", re.I),
)


def match_dtype(line: str) -> str | None:
    """The compute dtype a log line announces, normalised ("torch.bfloat16", "torch.float16",
    "torch.float32"), or None. Pure; lines that print tensors do not count."""
    low = line.lower()
    if not ("16" in low or "32" in low or "float" in low or "half" in low) or "tensor(" in low:
        return None  # the common case, cheaply
    text = ANSI.sub("", line)
    for pattern in DTYPE_PATTERNS:
        m = pattern.search(text)
        if m:
            word = m.group("d").lower().removeprefix("torch.")
            return _DTYPE_NAMES.get(word)
    return None


# --- phases a log announces: evaluation, checkpointing, compilation ----------------------

# Lines a training loop prints while it legitimately makes no step progress. They only
# ever buy a bounded grace (the monitor times a phase), so false positives cost a later
# alarm, never a missed one. "val_loss" inside a step line is harmless: a new step ends
# the phase (agent/logs.py keeps a phase line only until the next step).
PHASE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # HF "***** Running Evaluation *****", "eval step 3", Megatron "validation loss at iteration",
    # nanochat "Validation bpb", Lightning "Validation DataLoader 0", "evaluating on ...".
    ("evaluation", re.compile(r"(?<![a-z])(?:eval(?:uat\w*)?|validat\w*|val[ _/-]?(?:loss|bpb|acc\w*|ppl|step))"
                              r"(?![a-z])", re.I)),
    # HF "Saving model checkpoint to", Megatron "saving checkpoint at iteration", torchtitan
    # "Saving the checkpoint", DCP "Saving state dict", "writing checkpoint", "checkpointing".
    ("checkpoint", re.compile(r"\b(?:sav(?:e|ing)|writ(?:e|ing))\b.{0,40}?\b(?:checkpoint|ckpt|state[ _]dict|weights)"
                              r"|\bcheckpointing\b", re.I)),
    # "Compiling the model...", "Recompiling ...". (torch._dynamo's own warnings are not
    # enough: "hit config.cache_size_limit" means it stopped compiling.)
    ("compilation", re.compile(r"\b(?:re)?compiling\b", re.I)),
)
# Lines that name a phase without being in it: skipped or disabled phases, and traceback
# lines ('File ".../torch/_dynamo/eval_frame.py"').
NOT_A_PHASE = re.compile(r"\bskip\w*|\bdisabl\w*|\bno (?:eval|validation)|^\s*File \"", re.I)
_PHASE_WORDS = ("eval", "val", "sav", "writ", "checkpoint", "compil")


def match_phase(line: str) -> str | None:
    """The phase ("evaluation", "checkpoint", "compilation") a log line announces, or None."""
    low = line.lower()
    if not any(w in low for w in _PHASE_WORDS):
        return None  # the common case, cheaply
    text = ANSI.sub("", line)
    if NOT_A_PHASE.search(text):
        return None
    for phase, pattern in PHASE_PATTERNS:
        if pattern.search(text):
            return phase
    return None
