"""What changed while the monitor was unreachable, kept in order and delivered when it is back.

The sender only ever sends the newest report, so an outage used to erase everything between
its first and last second: a rank that exited and was restarted, the first stacks of a stall,
the log errors of a crash. While the monitor cannot be reached, every report the agent takes is
offered here; one is kept when it differs from the last kept one in what the diagnosis reads
as an event (``signature``: a rank appeared, ended, changed process state, logged a new error,
got its first stack; a launcher came or went), the next one a second after such an event (the
monitor confirms over two readings), and otherwise one every ``keep_every_s`` so the monitor
sees the pace of the outage too. Kept reports are full reports with the time
they were taken; the sender delivers them oldest first, marked ``replayed``, before anything new.

Bounded by entries and bytes: past a bound the oldest periodic entry goes first (events are
kept longest). With ``path`` the journal is also a JSON-lines file, so an agent restarted
during the outage still delivers what it kept.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_ENTRIES = 512
MAX_BYTES = 32 * 1024 * 1024
KEEP_EVERY_S = 5.0
# The report after an event is kept sooner: the monitor confirms what it reads over two readings.
FOLLOW_UP_S = 1.0


@dataclass(frozen=True)
class Kept:
    taken_at: float
    report: dict
    event: bool  # kept because something changed (not only because time passed)
    size: int


def _rank_signature(rank: dict) -> Hashable:
    exit_ = rank.get("exit") or {}
    stack = rank.get("stack") or {}
    threads = stack.get("threads") or [{}]
    frames = threads[0].get("frames") or [{}]
    errors = rank.get("log_errors") or []
    return (rank.get("job_id"), rank.get("rank"), rank.get("pid"), bool(rank.get("alive", True)),
            exit_.get("code"), exit_.get("signal"), rank.get("state"),
            len(errors), errors[-1] if errors else None,
            frames[0].get("name") if stack else None)


def signature(report: dict) -> Hashable:
    """What, if it differs between two reports, is an event worth keeping (pure)."""
    ranks = tuple(sorted((_rank_signature(r) for r in report.get("ranks") or ()), key=repr))
    launchers = tuple(sorted((lr.get("pid"), bool(lr.get("alive", True)), len(lr.get("log_errors") or ()))
                             for lr in report.get("launchers") or ()))
    orphans = tuple(sorted(o.get("pid") for o in report.get("orphans") or ()))
    return ranks, launchers, orphans


class OutageJournal:
    def __init__(self, path: Path | None = None, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES,
                 keep_every_s: float = KEEP_EVERY_S) -> None:
        self.path, self.max_entries, self.max_bytes, self.keep_every_s = path, max_entries, max_bytes, keep_every_s
        self._entries: list[Kept] = []
        self._bytes = 0
        self._last_signature: Hashable | None = None
        self._last_kept_at: float | None = None
        self._last_was_event = False
        self.dropped = 0
        if path is not None:
            self._load()

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, report: dict, taken_at: float) -> bool:
        """Offer one report taken during the outage; True when it was kept."""
        sig = signature(report)
        event = sig != self._last_signature
        if not event and self._last_kept_at is not None:
            wait = FOLLOW_UP_S if self._last_was_event else self.keep_every_s
            if taken_at - self._last_kept_at < wait:
                return False
        line = json.dumps({"taken_at": taken_at, "event": event, "report": report})
        self._entries.append(Kept(taken_at, report, event, len(line)))
        self._bytes += len(line)
        self._last_signature, self._last_kept_at, self._last_was_event = sig, taken_at, event
        if self._over_bounds():
            self._shed()
            self._rewrite()
        else:
            self._append(line)
        return True

    def entries(self) -> list[Kept]:
        """What is kept, oldest first (a copy)."""
        return list(self._entries)

    def oldest(self) -> Kept | None:
        return self._entries[0] if self._entries else None

    def delivered_oldest(self) -> None:
        kept = self._entries.pop(0)
        self._bytes -= kept.size
        if not self._entries:
            self.clear()

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self._last_signature = self._last_kept_at = None
        self._last_was_event = False
        self._rewrite()

    def _over_bounds(self) -> bool:
        return len(self._entries) > self.max_entries or self._bytes > self.max_bytes

    def _shed(self) -> None:
        while self._over_bounds() and len(self._entries) > 1:
            # The oldest periodic entry first; past those, the oldest event (never the newest entry).
            victim = next((i for i, k in enumerate(self._entries[:-1]) if not k.event), 0)
            self._bytes -= self._entries.pop(victim).size
            self.dropped += 1

    # --- the file ---

    def _append(self, line: str) -> None:
        if self.path is None:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:
            log.warning("outage journal %s: %s (kept in memory only)", self.path, exc.strerror or exc)

    def _rewrite(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                for k in self._entries:
                    f.write(json.dumps({"taken_at": k.taken_at, "event": k.event, "report": k.report}) + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("outage journal %s: %s (kept in memory only)", self.path, exc.strerror or exc)

    def _load(self) -> None:
        assert self.path is not None
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("outage journal %s unreadable (%s): starting empty", self.path, exc)
            return
        for line in lines:
            try:
                data: Any = json.loads(line)
                kept = Kept(float(data["taken_at"]), dict(data["report"]), bool(data["event"]), len(line))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash
            self._entries.append(kept)
            self._bytes += kept.size
        self._entries.sort(key=lambda k: k.taken_at)
        self._shed()
        if self._entries:
            log.info("outage journal %s: %d reports from before the restart to deliver", self.path, len(self))
