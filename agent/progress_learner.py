"""Step progress learned from any log, without knowing its format (issue 18).

Per log stream (a file, or one rank's lines in it), every line is reduced to its template: its
numbers masked. A template that recurs while time passes and carries an integer field that rises
by a steady stride from one of its lines to the next is the job's step line; that field is the
step, and the number after a ``/`` next to it, when it stays the same, the total
(``Iter(train) [  120/40000]``). A field that falls back while another field of the line rises
by one is a counter that restarts each epoch. JSON lines give the step by name (``step``,
``iter``, ``global_step``, ...). A template that recurs at a steady pace but counts nothing is a
heartbeat: progress without a step number.

What is never a step: a number with a fraction or an exponent (a loss, a learning rate), a
timestamp or a duration (masked before anything else), a number right after a word that names a
measure (loss, lr, eta, time, mem, tokens, ...) or right before a unit (``ms``, ``MB``,
``it/s``, ``%``), and a counter that only ever moved within one read of the log (NCCL's channel
list, a table of per-class metrics: all printed at once).

Pure: the caller feeds ``(line, read_at)`` pairs; tests feed log text.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from agent.logpatterns import ANSI, json_object

# Lines of one template kept to learn from, and the lines that make it sure.
KEPT_PER_TEMPLATE = 8
SURE_AFTER = 3
TEMPLATES_KEPT = 256
MAX_LINE = 2000

JSON_STEP_KEYS = ("global_step", "step", "iteration", "iter", "num_updates", "update", "batch", "trainer/global_step")
JSON_TOTAL_KEYS = ("total_steps", "max_steps", "max_iters", "total_iters", "num_training_steps")

# Masked first, never a step: dates, clock times, durations and ETAs written as h:mm:ss.
_TIMESTAMP = re.compile(
    r"\d{4}[-/]\d{1,2}[-/]\d{1,2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b\d{1,2}/\d{1,2}\s+\d{1,2}:\d{2}:\d{2}"  # detectron2's "[07/25 10:20:30"
    r"|\b\d+\s+days?,\s*\d{1,2}:\d{2}:\d{2}"  # "1 day, 2:03:04"
    r"|\b\d{1,3}:\d{2}(?::\d{2})?(?:[.,]\d+)?"  # 12:34:56, 00:05, 1:23
    r"|\b[IWEF]\d{4}\s"  # absl/glog "I0101 "
)
# A number: its sign, digits, fraction, exponent, and the characters either side that decide
# what kind of number it is.
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_WORD_BEFORE = re.compile(r"([A-Za-z_@/%]+)[^A-Za-z0-9]{0,3}$")
_UNIT_AFTER = re.compile(r"^\s?(?:ms|s|sec|secs|seconds|min|h|us|ns|[kKMGT]i?B|[kKMGT]\b|%|it/s|s/it|tok/s|"
                         r"tokens/s|samples/s|img/s|/s|x\b)")
# Words that name a measure: the number after them is a measure, not a counter.
MEASURE_WORDS = frozenset("""
loss losses nll ppl perplexity acc accuracy lr learning_rate mom momentum wd eta time data_time iter_time
forward_time backward_time elapsed wall train_wall dt mem memory max_mem gb_free gnorm grad_norm norm tok
tokens tok/s wps ups wpb bsz samples throughput speed mfu tflops flops gpu cpu temp score f1 bleu rouge
top1 top5 map auc scale loss_scale clip ms sec seconds s mb gb kb mib gib rank local_rank world_size pid
port tid seed size dim hidden heads layers
""".split())
# Words that announce a counter: a tie between candidate fields goes to the field after one.
COUNTER_WORDS = frozenset("step steps iter iters iteration it batch batches update updates global_step num_updates "
                          "epoch ep train".split())
_BLANKS = re.compile(r"[ \t]+")
EVAL_WORDS = re.compile(r"\b(?:eval|evaluat\w*|valid\w*|val|test\w*)\b", re.IGNORECASE)
# A heartbeat must show work being done: never a line about waiting, failing or retrying, which a
# hung job prints at a steady pace too (NCCL/gloo watchdogs, elastic heartbeats, retry loops).
NOT_A_HEARTBEAT = re.compile(r"warn|error|exception|traceback|timeout|timed out|wait|retry|retrying|hang|stuck|"
                             r"heartbeat|watchdog|barrier|rendezvous|connect|alive|idle|health|nccl|gloo", re.IGNORECASE)
# A heartbeat's lines: read in this many different reads, none further from the last than
# HEARTBEAT_GAP_FACTOR times their usual spacing (a steady pace, not a burst now and then) ...
HEARTBEAT_READS = 3
HEARTBEAT_GAP_FACTOR = 3.0
# ... or two reads of this many moving lines each: a pace fast enough to show within one read
# (a job that logs every step), learned as soon as a counter would be.
FAST_BEAT_LINES = 3


@dataclass(frozen=True)
class LearnedStep:
    """Progress read from one line: its step (None for a heartbeat), its total, and what was learned."""

    step: int | None
    total: int | None
    template: str
    # How many lines of the template agreed with the counter (or the heartbeat's pace).
    confidence: int
    kind: str  # "counter", "json" or "heartbeat"
    # When a counter (or heartbeat) is first learned: the steps its lines showed in earlier reads
    # (the beats counted by then), as (read_at, step), oldest first. Learning takes a second read, and without these a job that stalls
    # right after it would show one read's steps, all at one time: no pace, as if it logged nothing.
    earlier: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class _Field:
    value: int
    # The number after "value/" when the line writes "value/total".
    total: int | None
    countable: bool


@dataclass
class _Template:
    text: str
    seen: deque[tuple[float, tuple[_Field, ...]]] = field(default_factory=lambda: deque(maxlen=KEPT_PER_TEMPLATE))
    eval_like: bool = False
    # Once a counter was read in it, a template never counts as a heartbeat: a fast job's many
    # lines per read leave stretches where the kept lines all share one read and cannot show
    # the counter, and those must not turn the step into a count of lines.
    counted: bool = False
    # For a heartbeat: whether it may be one, its recent reads (when, and how many of its lines
    # with moving values each held), the values of its last line (the same again says nothing),
    # and the beats counted so far.
    may_beat: bool = False
    beat_reads: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=KEPT_PER_TEMPLATE))
    last_measures: str = ""
    beats: int = 0


@dataclass(frozen=True)
class _Counter:
    position: int
    stride: int
    agreeing: int
    named: bool
    has_total: bool


def masked(line: str) -> tuple[str, tuple[_Field, ...]]:
    """The line's template (numbers as ``#``, timestamps as ``T``) and its integer fields."""
    text = _TIMESTAMP.sub("T", line)
    fields: list[_Field] = []
    parts: list[str] = []
    last = 0
    for m in _NUMBER.finditer(text):
        raw = m.group()
        before, after = text[: m.start()], text[m.end() :]
        if before and (before[-1].isalpha() or before[-1] == "_") and raw[0] not in "+-":
            continue  # part of a name: "fp16", "layer3", "v2"
        parts.append(text[last : m.start()])
        last = m.end()
        integer = re.fullmatch(r"[-+]?\d+", raw) is not None
        if not integer:
            parts.append("#.#")
            continue
        parts.append("#")
        word = _WORD_BEFORE.search(before)
        named_measure = word is not None and word.group(1).lower().strip("_/") in MEASURE_WORDS
        unit = _UNIT_AFTER.match(after) is not None
        total_m = re.match(r"\s*/\s*(\d+)(?![\d.])", after)
        countable = not named_measure and not unit and not raw.startswith(("-", "+"))
        fields.append(_Field(int(raw), int(total_m.group(1)) if total_m else None, countable))
    parts.append(text[last:])
    # Runs of blanks as one: right-aligned counters ("[   99/1000]", "[  100/1000]") keep their template.
    return _BLANKS.sub(" ", "".join(parts)).strip(), tuple(fields)


def _word_before(template: str, position: int) -> str | None:
    """The word before the ``position``-th integer placeholder of a template."""
    count = -1
    for m in re.finditer(r"#(?:\.#)?", template):
        if m.group() == "#":
            count += 1
            if count == position:
                w = _WORD_BEFORE.search(template[: m.start()])
                return w.group(1).lower() if w else None
    return None


def _counter(template: _Template) -> _Counter | None:
    """The field of the template that counts steps, if its recent lines show one."""
    seen = list(template.seen)
    if len(seen) < SURE_AFTER or len({at for at, _ in seen}) < 2:
        return None  # too few lines, or all read at once: time has not been seen to pass
    width = len(seen[-1][1])
    if any(len(fields) != width for _, fields in seen):
        return None
    best: _Counter | None = None
    for i in range(width):
        if not all(fields[i].countable for _, fields in seen):
            continue
        values = [fields[i].value for _, fields in seen]
        distinct = [v for j, v in enumerate(values) if j == 0 or v != values[j - 1]]  # ranks repeating a line
        if len(distinct) < SURE_AFTER:
            continue
        strides = {b - a for a, b in zip(distinct, distinct[1:]) if b > a}
        falls = [j for j, (a, b) in enumerate(zip(distinct, distinct[1:])) if b < a]
        if len(strides) != 1 or next(iter(strides)) <= 0:
            continue
        if falls and _epoch_field(seen, i) is None:
            continue  # it fell back without an epoch rising: not a counter
        totals = {fields[i].total for _, fields in seen}
        word = _word_before(template.text, i)
        found = _Counter(i, next(iter(strides)), len(distinct), word in COUNTER_WORDS,
                         len(totals) == 1 and None not in totals)
        if best is None or _rank(found) > _rank(best):
            best = found
    return best


def _rank(c: _Counter) -> tuple[bool, bool, bool, int, int]:
    return (c.has_total, c.named, c.stride == 1, c.agreeing, -c.position)


def _epoch_field(seen: list[tuple[float, tuple[_Field, ...]]], counter: int) -> int | None:
    """The field that rises by one where the counter falls back (a counter restarting each epoch)."""
    width = len(seen[0][1])
    for j in range(width):
        if j == counter:
            continue
        ok = True
        for (_, a), (_, b) in zip(seen, seen[1:]):
            if b[counter].value < a[counter].value:
                ok = ok and b[j].value == a[j].value + 1
            elif b[j].value != a[j].value:
                ok = False
        if ok:
            return j
    return None


class ProgressLearner:
    """One log stream's learner: ``feed`` each line as it is read; it answers progress once it knows."""

    def __init__(self) -> None:
        self._templates: dict[str, _Template] = {}
        self.learned: str | None = None  # the template taken as the step line, once sure

    def feed(self, line: str, read_at: float) -> LearnedStep | None:
        line = ANSI.sub("", line)[:MAX_LINE]
        found = None
        for segment in line.split("\r"):  # a progress bar rewrites itself with \r
            segment = segment.strip()
            if segment:
                found = self._feed_one(segment, read_at) or found
        return found

    def _feed_one(self, text: str, read_at: float) -> LearnedStep | None:
        if text.startswith("{"):
            step = _json_step(text)
            if step is not None:
                return step
        template_text, fields = masked(text)
        if not fields and "#.#" not in template_text:
            return None  # no number: nothing that could count or show work
        template = self._templates.get(template_text)
        if template is None:
            if len(self._templates) >= TEMPLATES_KEPT:
                self._forget_one()
            eval_like = bool(EVAL_WORDS.search(text))
            template = self._templates[template_text] = _Template(
                template_text, eval_like=eval_like,
                may_beat="#.#" in template_text and not eval_like and not NOT_A_HEARTBEAT.search(template_text))
        if fields and (not template.seen or template.seen[-1][1] != fields):
            # The same line again (several ranks printing one step to one file) adds nothing.
            template.seen.append((read_at, fields))
        counter = _counter(template) if fields else None
        if counter is None:
            return self._beat(template, text, read_at) if template.may_beat and not template.counted else None
        template.counted = True
        if not self._preferred(template, counter):
            return None
        value = fields[counter.position]
        earlier: list[tuple[float, int]] = []
        if self.learned != template_text:
            for at, kept in template.seen:
                step = kept[counter.position].value
                if at < read_at and step < value.value and (not earlier or step > earlier[-1][1]):
                    earlier.append((at, step))
        self.learned = template_text
        return LearnedStep(value.value, value.total, template_text, counter.agreeing, "counter", tuple(earlier))

    def _preferred(self, template: _Template, counter: _Counter) -> bool:
        """Whether this template is the step line: the learned one stays until another counts
        better (eval and validation lines only when nothing else counts)."""
        if self.learned is None or self.learned == template.text:
            return True
        current = self._templates.get(self.learned)
        mine = _counter(current) if current is not None else None
        if mine is None:
            return True
        if template.eval_like != current.eval_like:  # type: ignore[union-attr]
            return not template.eval_like
        if current.seen and template.seen and current.seen[-1][0] < template.seen[0][0]:
            return True  # the learned line stopped before this one began: the format changed
        return _rank(counter) > _rank(mine) and counter.agreeing > mine.agreeing

    def _beat(self, template: _Template, text: str, read_at: float) -> LearnedStep | None:
        """The template as a heartbeat: progress without a step number, counted in beats, taken only
        while no line with a counter is learned (a counter, once seen, wins)."""
        measures = " ".join(m.group() for m in _NUMBER.finditer(_TIMESTAMP.sub("", text)))
        if measures == template.last_measures:
            return None  # the same values again: another rank's copy, or a status line that did not move
        template.last_measures = measures
        # Reads, not lines: a fast job prints many per read.
        if template.beat_reads and template.beat_reads[-1][0] == read_at:
            template.beat_reads[-1] = (read_at, template.beat_reads[-1][1] + 1)
        else:
            template.beat_reads.append((read_at, 1))
        template.beats += 1
        if self.learned is not None and self.learned != template.text:
            current = self._templates.get(self.learned)
            if current is None or not current.may_beat or current.counted:
                return None  # a counter is learned (or a line that may not beat)
        reads = [at for at, _ in template.beat_reads]
        fewest_lines = min(lines for _, lines in template.beat_reads)
        if len(reads) < 2 or (len(reads) < HEARTBEAT_READS and fewest_lines < FAST_BEAT_LINES):
            return None
        gaps = [b - a for a, b in zip(reads, reads[1:])]
        if max(gaps) > HEARTBEAT_GAP_FACTOR * sorted(gaps)[(len(gaps) - 1) // 2]:
            return None  # bursts now and then, not a pace
        earlier: list[tuple[float, int]] = []
        if self.learned != template.text:  # first learned: the beats of the earlier reads too
            count = template.beats - sum(lines for _, lines in template.beat_reads)
            for at, lines in template.beat_reads:
                count += lines
                if at < read_at:
                    earlier.append((at, count))
        self.learned = template.text
        return LearnedStep(template.beats, None, template.text, len(reads), "heartbeat", tuple(earlier))

    def _forget_one(self) -> None:
        oldest = min((t for t in self._templates.values() if t.text != self.learned),
                     key=lambda t: t.seen[-1][0] if t.seen else 0.0, default=None)
        if oldest is not None:
            del self._templates[oldest.text]


def _json_step(text: str) -> LearnedStep | None:
    data = json_object(text)
    if data is None:
        return None
    for key in JSON_STEP_KEYS:
        step = _integer(data.get(key))
        if step is not None:
            total = next((t for t in (_integer(data.get(k)) for k in JSON_TOTAL_KEYS) if t is not None), None)
            return LearnedStep(step, total, f'{{"{key}": #, ...}}', 1, "json")
    return None


def _integer(value: object) -> int | None:
    """An integer step from JSON: a number without a fraction, or digits in a string (fairseq)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
