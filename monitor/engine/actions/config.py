"""What the monitor may do about a verdict: the actions file (TOML), read and checked at start.

Nothing acts unless the monitor is given this file (``--actions``), and a file that does not
say ``dry_run = false`` only records what it would have done. Example::

    dry_run = false          # default true: every decision is in the audit log, nothing runs
    max_actions = 5          # at most this many actions ...
    per_seconds = 3600       # ... in this window, over every job (a fleet-wide fault is not 500 scancels)

    [[rule]]
    name = "cancel"
    verdicts = ["deadlock", "stalled"]
    after_s = 600            # the verdict held this long (published, not raw)
    command = ["scancel", "--", "{slurm_job}"]   # placeholders: data in their formats (placeholders.py)

    [[rule]]
    name = "chat"
    verdicts = ["deadlock"]
    after_s = 60
    webhook = "https://chat.example/hooks/T0/B0"   # the same JSON, POSTed

    [[rule]]
    name = "restart-culprits"
    verdicts = ["deadlock"]
    after_s = 120
    signal = "SIGTERM"       # the culprits' agents signal them (agents need --allow-signals)

A rule acts at most once per incident. Verdicts it may name are the incident verdicts: an alarm,
an exited or a stopped rank; never ``healthy``, ``finished`` or ``unknown``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from monitor.engine.actions.placeholders import FORMATS, PLACEHOLDER
from monitor.engine.incidents import INCIDENT_VERDICTS

KINDS = ("command", "webhook", "signal")
# Signals an agent may send a rank: ones a launcher reads as a worker failure (and restarts) or
# that make torch dump its state. Never SIGKILL: it leaves no traceback and no flight record.
SIGNALS = ("SIGTERM", "SIGABRT", "SIGINT", "SIGUSR1", "SIGUSR2")
# What a command's arguments may name: the job's identity, each in its format (monitor/engine/actions/placeholders.py).
PLACEHOLDERS = tuple(FORMATS)
_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.\-]{0,63}$")
DEFAULT_TIMEOUT_S = 30.0


class ActionConfigError(ValueError):
    """One line naming the file and what in it cannot work."""


@dataclass(frozen=True)
class ActionRule:
    name: str
    verdicts: frozenset[str]
    after_s: float
    kind: str  # one of KINDS
    command: tuple[str, ...] = ()
    webhook: str | None = None
    signal: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def target(self) -> str:
        """What the rule acts with, as the audit log shows it."""
        if self.kind == "command":
            return " ".join(self.command)
        if self.kind == "webhook":
            return self.webhook or ""
        return f"{self.signal} to the culprit ranks"


@dataclass(frozen=True)
class ActionConfig:
    rules: tuple[ActionRule, ...]
    dry_run: bool = True
    max_actions: int = 5
    per_seconds: float = 3600.0
    # Act on jobs whose nodes report with a shared token (or none): any client could have spoken
    # for them. Only for a single-tenant network where every poster is trusted.
    trust_unbound_nodes: bool = False
    # Where a person sees the evidence: {job} is the job id (the monitor's own page by default).
    evidence_url: str | None = None

    @property
    def verdicts(self) -> frozenset[str]:
        return frozenset().union(*(r.verdicts for r in self.rules)) if self.rules else frozenset()


def load_actions(path: Path) -> ActionConfig:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ActionConfigError(f"actions file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ActionConfigError(f"actions file {path}: not TOML: {exc}") from None
    try:
        return parse_actions(raw)
    except ActionConfigError as exc:
        raise ActionConfigError(f"actions file {path}: {exc}") from None


def parse_actions(raw: dict[str, Any]) -> ActionConfig:
    """The checked configuration of a parsed TOML document (pure)."""
    known = {"dry_run", "max_actions", "per_seconds", "trust_unbound_nodes", "evidence_url", "rule"}
    _no_unknown(raw, known, "the file")
    rules_raw = raw.get("rule", [])
    if not isinstance(rules_raw, list) or not rules_raw:
        raise ActionConfigError("no [[rule]]: say what to do, or leave --actions out")
    rules = tuple(_rule(r, i) for i, r in enumerate(rules_raw))
    names = [r.name for r in rules]
    if len(set(names)) != len(names):
        raise ActionConfigError(f"rule names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
    max_actions = _number(raw, "max_actions", 5, "the file", integer=True)
    per_seconds = _number(raw, "per_seconds", 3600.0, "the file")
    if max_actions < 1 or per_seconds <= 0:
        raise ActionConfigError("max_actions must be at least 1 and per_seconds above 0")
    evidence_url = raw.get("evidence_url")
    if evidence_url is not None and not (isinstance(evidence_url, str) and evidence_url.startswith(("http://",
                                                                                                     "https://"))):
        raise ActionConfigError("evidence_url must be an http(s) URL")
    return ActionConfig(rules, dry_run=_flag(raw, "dry_run", True), max_actions=int(max_actions),
                        per_seconds=float(per_seconds), trust_unbound_nodes=_flag(raw, "trust_unbound_nodes", False),
                        evidence_url=evidence_url)


def _rule(raw: Any, index: int) -> ActionRule:
    where = f"rule {index + 1}"
    if not isinstance(raw, dict):
        raise ActionConfigError(f"{where} is not a table")
    _no_unknown(raw, {"name", "verdicts", "after_s", "command", "webhook", "signal", "timeout_s"}, where)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ActionConfigError(f"{where}: name must be 1-64 letters, digits, '_', '.' or '-' (not first)")
    where = f"rule {name!r}"
    verdicts = raw.get("verdicts")
    if not isinstance(verdicts, list) or not verdicts or not all(isinstance(v, str) for v in verdicts):
        raise ActionConfigError(f"{where}: verdicts must be a list of verdict names")
    wrong = sorted(set(verdicts) - INCIDENT_VERDICTS)
    if wrong:
        raise ActionConfigError(f"{where}: cannot act on {wrong}; verdicts that may act: {sorted(INCIDENT_VERDICTS)}")
    after_s = _number(raw, "after_s", None, where)
    if after_s < 0:
        raise ActionConfigError(f"{where}: after_s must not be negative")
    timeout_s = _number(raw, "timeout_s", DEFAULT_TIMEOUT_S, where)
    if not 0 < timeout_s <= 600:
        raise ActionConfigError(f"{where}: timeout_s must be in (0, 600]")
    given = [k for k in KINDS if k in raw]
    if len(given) != 1:
        raise ActionConfigError(f"{where}: give exactly one of command, webhook, signal (got {given or 'none'})")
    kind = given[0]
    rule = ActionRule(name, frozenset(verdicts), float(after_s), kind, timeout_s=float(timeout_s))
    if kind == "command":
        command = raw["command"]
        if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
            raise ActionConfigError(f"{where}: command must be a list of arguments (no shell), e.g. "
                                    '["scancel", "--", "{slurm_job}"]')
        for arg in command:
            unknown = [p for p in PLACEHOLDER.findall(arg) if p not in PLACEHOLDERS]
            if unknown:
                raise ActionConfigError(f"{where}: unknown placeholder {{{unknown[0]}}}; known: {list(PLACEHOLDERS)}")
        return replace(rule, command=tuple(command))
    if kind == "webhook":
        url = raw["webhook"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ActionConfigError(f"{where}: webhook must be an http(s) URL")
        return replace(rule, webhook=url)
    name_of_signal = raw["signal"]
    if name_of_signal not in SIGNALS:
        raise ActionConfigError(f"{where}: signal must be one of {list(SIGNALS)}")
    return replace(rule, signal=name_of_signal)


def _no_unknown(raw: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ActionConfigError(f"{where}: unknown key {unknown[0]!r} (known: {sorted(known)})")


def _number(raw: dict[str, Any], key: str, default: float | None, where: str, integer: bool = False) -> float:
    value = raw.get(key, default)
    if value is None:
        raise ActionConfigError(f"{where}: {key} is required")
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ActionConfigError(f"{where}: {key} must be a{'n integer' if integer else ' number'}")
    return float(value)


def _flag(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ActionConfigError(f"{key} must be true or false")
    return value
