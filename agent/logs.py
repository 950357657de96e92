"""Follow the ranks' log files for progress lines and errors.

A rank's logs are its stdout/stderr when they are regular files (found through
/proc/PID/fd/1 and /fd/2), the files it holds open for appending (its own log file:
agent/appended_files.py), plus the --log files tied to its job (agent/log_owners.py).
One tailer per file (by inode), shared by every rank writing to it. A file's lines go
to the ranks of one job only: the ranks writing it, or the job a --log file is tied to;
a file written by ranks of several jobs, or a --log file tied to none, is read (for
launcher failure records) but credits no rank. Attribution of a line among those ranks:
  - "[rankN]:" / "[defaultN]:" prefix (global / local rank) -> that rank;
  - a file written by exactly one rank -> that rank (scope "rank");
  - unprefixed lines of a file shared by several ranks, or of a --log file ->
    every rank sharing it (scope "job").
"""

from __future__ import annotations

import logging
import os
import re
import stat as stat_module
from collections import deque
from dataclasses import dataclass, field

from agent.appended_files import AppendedFiles
from agent.discovery import RankProcess
from agent.logpatterns import (
    LauncherBlockParser,
    LauncherFailure,
    Progress,
    TracebackTracker,
    match_dtype,
    match_phase,
    match_progress,
    split_prefixes,
)
from agent.log_owners import LogOwners, LogSource, job_aliases
from agent.progress_learner import ProgressLearner

log = logging.getLogger("agent")

FIRST_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 4 * 1024 * 1024
RECENT_PROGRESS = 32
KEPT_ERRORS = 10
LINE_MAX = 2048
LINE_SPLIT = re.compile(rb"[\r\n]")  # tqdm redraws its bar with \r
# Writers (ranks by their prefixes) per file whose lines are learned from; the report's pattern
# field holds the learned template up to this length.
LEARNERS_PER_FILE = 64
LEARNED_PATTERN_MAX = 200


class FileTailer:
    """Reads what was appended to one open file since the last call, as whole lines."""

    def __init__(self, path: str, opened: str, from_start: bool = False, text_only: bool = False):
        self.path = path  # a name for reports; reading goes through the open file
        # A file found only by how it is opened (appended to) may hold anything: the first NUL
        # byte read says it is not a log, and it is read no further.
        self.text_only = text_only
        self.binary = False
        self.file = open(opened, "rb")
        size = os.fstat(self.file.fileno()).st_size
        self.offset = 0 if from_start else max(0, size - FIRST_READ_BYTES)
        self.partial = b""
        self.skip_first = self.offset > 0  # we started mid-line
        self.backlog = not from_start  # the first read is history, not live progress

    def read_lines(self) -> list[str]:
        if self.binary:
            return []
        size = os.fstat(self.file.fileno()).st_size
        if size < self.offset:  # truncated (copytruncate rotation, or rewritten)
            self.offset, self.partial = 0, b""
        if size - self.offset > MAX_READ_BYTES:  # fell far behind: keep only the tail
            self.offset, self.partial, self.skip_first = size - FIRST_READ_BYTES, b"", True
        if size == self.offset:
            return []
        self.file.seek(self.offset)
        data = self.partial + self.file.read(size - self.offset)
        self.offset = size
        if self.text_only and b"\0" in data:
            self.binary, self.partial = True, b""
            log.info("%s: not a text log (a NUL byte): no longer read", self.path)
            return []
        pieces = LINE_SPLIT.split(data)
        self.partial = pieces.pop()
        if self.skip_first and pieces:
            pieces, self.skip_first = pieces[1:], False
        return [p.decode("utf-8", "replace")[:LINE_MAX] for p in pieces if p.strip()]

    def close(self) -> None:
        self.file.close()


@dataclass
class ProgressTracker:
    scope: str
    events: int = 0
    step: int | None = None
    total: int | None = None
    step_at: float | None = None
    source: str = ""
    pattern: str = ""
    last_line: str | None = None
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_PROGRESS))

    def add(self, progress: Progress, now: float, source: str, line: str, live: bool) -> None:
        self.last_line = line
        if self.events and (progress.step, progress.pattern) == (self.step, self.pattern):
            return  # the same step printed again (a tqdm refresh, or by another rank)
        self.events += 1
        self.step, self.total, self.pattern = progress.step, progress.total, progress.pattern
        self.step_at, self.source = now, source
        if live:
            self.recent.append((now, progress.step))

    def report(self) -> dict:
        return {
            "events": self.events,
            "step": self.step,
            "total_steps": self.total,
            "step_at": self.step_at,
            "scope": self.scope,
            "source": self.source[:1024],
            "pattern": self.pattern,
            "last_line": self.last_line,
            "recent": list(self.recent),
        }


@dataclass
class _RankLog:
    progress: dict[str, ProgressTracker] = field(default_factory=dict)  # scope -> tracker
    errors: deque = field(default_factory=lambda: deque(maxlen=KEPT_ERRORS))
    dtype: tuple[str, str] | None = None  # (normalised dtype, the line), the latest announced
    # The latest phase line printed after the rank's last new step ({"phase", "seen_at",
    # "line"}); a new step clears it. Line order decides, not read time: a step and the
    # "Running Evaluation" after it often arrive in one read and share a timestamp.
    phase: dict | None = None


@dataclass
class _File:
    tailer: FileTailer
    tracebacks: dict[tuple, TracebackTracker] = field(default_factory=dict)
    launcher: LauncherBlockParser = field(default_factory=LauncherBlockParser)
    # Per writer in the file ((rank, local rank) from its prefixes): what its lines taught about
    # where its step is, for logs no built-in pattern knows (agent/progress_learner.py).
    learners: dict[tuple, ProgressLearner] = field(default_factory=dict)


class LogFollower:
    def __init__(
        self,
        proc_root: str = "/proc",
        extra_paths: tuple[str, ...] = (),
        user_pattern: re.Pattern[str] | None = None,
    ):
        self.proc_root = proc_root
        self.sources = [LogSource.parse(p) for p in extra_paths]
        self.user_pattern = user_pattern
        self.owners = LogOwners(proc_root)
        self.appended = AppendedFiles(proc_root)
        self._appended_keys: set[tuple[int, int]] = set()  # files found as a rank's appended log
        self._unreadable: set[tuple[int, int]] = set()  # files that could not be opened (said once)
        self._files: dict[tuple[int, int], _File] = {}
        self._extra_seen: set[str] = set()
        self._mixed_jobs: set[tuple[int, int]] = set()  # files said to be written by several jobs
        self._ranks: dict[int, _RankLog] = {}
        # pid -> the files it wrote, so a rank that just exited (its fds gone) still has its
        # last lines read: the dying rank's traceback is often the most useful line of all.
        self._rank_files: dict[int, list[tuple[int, int]]] = {}
        self._rank_extras: dict[int, list[tuple[int, int]]] = {}  # pid -> --log files credited to it

    def collect(self, ranks: list[RankProcess], now: float) -> list[LauncherFailure]:
        """Read new lines of every log; returns launcher failure records seen."""
        writers, stdio_keys, names, extras = self._find_files(ranks, now)
        for key in [k for k in self._files if k not in names]:
            self._files.pop(key).tailer.close()
        self._appended_keys &= names.keys()
        credited = self._credited_ranks(writers, stdio_keys, extras, ranks, now)
        failures: list[LauncherFailure] = []
        for key, (name, opened, from_start) in names.items():
            if key not in self._files:
                try:
                    tailer = FileTailer(name, opened, from_start, text_only=key in self._appended_keys)
                except OSError as e:  # not ours to read (a root-squashed mount), or gone meanwhile
                    if key not in self._unreadable:
                        self._unreadable.add(key)
                        log.info("log %s: cannot read it: %s", name, e)
                    continue
                self._files[key] = _File(tailer)
            entry = self._files[key]
            lines = entry.tailer.read_lines()
            live = not entry.tailer.backlog
            entry.tailer.backlog = False
            file_ranks = credited.get(key, [])
            for line in lines:
                failures.extend(self._route(entry, line, file_ranks, now, live))
        return failures

    def _credited_ranks(self, writers, stdio_keys, extras, ranks, now) -> dict[tuple[int, int], list[RankProcess]]:
        """The ranks each file's lines may go to: those writing it, or for a --log file nobody
        writes as stdout/stderr the ranks of the job it is tied to; always of one job. (A --log
        file a rank appends to is still tied by agent/log_owners.py: all its job's ranks.)"""
        untied = {key: source for key, source in extras.items() if source.job is not None or key not in stdio_keys}
        ties = self.owners.ties(untied, ranks, now)
        out: dict[tuple[int, int], list[RankProcess]] = {}
        for key in set(writers) | set(extras):
            tie = ties.get(key)
            if tie is not None:
                file_ranks = [r for r in ranks if tie.job in job_aliases(r)] if tie.job else []
            else:
                file_ranks = writers.get(key, [])
            jobs = {r.identity.job_id for r in file_ranks}
            if len(jobs) > 1:
                if key not in self._mixed_jobs:
                    self._mixed_jobs.add(key)
                    log.info("log %s: written by ranks of %d jobs (%s): its lines are credited to none",
                             self._path_of(key, extras), len(jobs), ", ".join(sorted(jobs)))
                file_ranks = []
            else:
                self._mixed_jobs.discard(key)
            out[key] = file_ranks
            for rank in file_ranks:
                if key in extras and key not in self._rank_extras.setdefault(rank.pid, []):
                    self._rank_extras[rank.pid].append(key)
        return out

    def _path_of(self, key, extras) -> str:
        if key in extras:
            return extras[key].path
        entry = self._files.get(key)
        return entry.tailer.path if entry else str(key)

    def progress_of(self, pid: int) -> dict | None:
        state = self._ranks.get(pid)
        if not state:
            return None
        # The freshest progress wins; on a tie a rank's own lines say more than the job's.
        # (A rank that printed a few prefixed lines, e.g. during evaluation, must not hide
        # the job's shared progress lines that follow.)
        trackers = [t for t in (state.progress.get("rank"), state.progress.get("job")) if t and t.events]
        if not trackers:
            return None
        return max(trackers, key=lambda t: (t.step_at or 0.0, t.scope == "rank")).report()

    def errors_of(self, pid: int) -> list[str]:
        state = self._ranks.get(pid)
        return list(state.errors) if state else []

    def phase_of(self, pid: int) -> dict | None:
        """The latest evaluation/checkpoint/compilation line seen for this rank (a report dict)."""
        state = self._ranks.get(pid)
        return dict(state.phase) if state and state.phase else None

    def dtype_of(self, pid: int) -> tuple[str, str] | None:
        state = self._ranks.get(pid)
        return state.dtype if state else None

    def files_of(self, pid: int) -> list[str]:
        """The log files the rank wrote, as the follower knows them (for an evidence capture)."""
        keys = self._rank_files.get(pid, []) + self._rank_extras.get(pid, [])
        return [self._files[k].tailer.path for k in dict.fromkeys(keys)
                if k in self._files and not self._files[k].tailer.binary]

    def forget(self, pid: int) -> None:
        self.appended.forget(pid)
        self._ranks.pop(pid, None)
        self._rank_files.pop(pid, None)
        self._rank_extras.pop(pid, None)

    def close(self) -> None:
        for entry in self._files.values():
            entry.tailer.close()
        self._files.clear()
        self._appended_keys.clear()

    def _find_files(self, ranks: list[RankProcess], now: float):
        """(writers: inode -> ranks writing it, stdio_keys: the inodes among them some rank's
        stdout or stderr is, names: inode -> (path, path to open, from start), extras: inode ->
        the --log argument it was found by)."""
        writers: dict[tuple[int, int], list[RankProcess]] = {}
        stdio_keys: set[tuple[int, int]] = set()
        names: dict[tuple[int, int], tuple[str, str, bool]] = {}
        for proc in ranks:
            found = []
            appended = dict(self.appended.of(proc.pid, now))
            for fd in (1, 2, *appended):
                link = f"{self.proc_root}/{proc.pid}/fd/{fd}"
                try:
                    target = os.readlink(link)
                    st = os.stat(link)  # follows the magic link to the open file itself
                except OSError:
                    continue
                if fd in appended and target != appended[fd]:
                    # The fd was closed and reused since the scan (code that opens its log per
                    # write, then a data file): not the log it was; list the fds again next time.
                    # (The link, read here anyway, tells; no fdinfo read per fd per tick.)
                    self.appended.forget(proc.pid)
                    continue
                if not stat_module.S_ISREG(st.st_mode):
                    continue  # a tty, pipe or socket
                key = (st.st_dev, st.st_ino)
                found.append(key)
                if fd <= 2:
                    stdio_keys.add(key)
                elif key not in names:
                    self._appended_keys.add(key)
                # Opening through /proc works even after the file was renamed or deleted.
                names.setdefault(key, (target, link, False))
            if found:
                self._rank_files[proc.pid] = found
            else:  # exited: keep reading the files it had, through our open tailers
                for key in self._rank_files.get(proc.pid, []):
                    if key in self._files:
                        found.append(key)
                        names.setdefault(key, (self._files[key].tailer.path, "", False))
            for key in found:
                if proc not in writers.setdefault(key, []):
                    writers[key].append(proc)
        extras: dict[tuple[int, int], LogSource] = {}
        for source in self.sources:
            path = source.path
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat_module.S_ISREG(st.st_mode):
                # A path seen before with a new inode was rotated: read the new file whole.
                key = (st.st_dev, st.st_ino)
                names.setdefault(key, (path, path, path in self._extra_seen))
                extras.setdefault(key, source)
                self._extra_seen.add(path)
        return writers, stdio_keys, names, extras

    @staticmethod
    def _learned(entry: _File, writer: tuple, text: str, now: float) -> list[tuple[Progress, float]]:
        """The step of a line in a format no built-in pattern knows, once the writer's lines showed
        which field counts (``--step-regex`` given: the user's pattern alone decides), with when it
        was read; on the line that taught the counter, first the steps of earlier reads."""
        learner = entry.learners.get(writer)
        if learner is None:
            if len(entry.learners) >= LEARNERS_PER_FILE:
                return []
            learner = entry.learners[writer] = ProgressLearner()
        found = learner.feed(text, now)
        if found is None or found.step is None:
            return []
        pattern = f"learned ({found.kind}, {found.confidence} lines agree): {found.template}"[:LEARNED_PATTERN_MAX]
        return [*((Progress(step, found.total, pattern), at) for at, step in found.earlier),
                (Progress(found.step, found.total, pattern), now)]

    def _route(self, entry, line, file_ranks, now, live) -> list[LauncherFailure]:
        p = split_prefixes(line)
        pool = file_ranks
        if p.rank is not None:
            targets, scope = [r for r in pool if r.identity.rank == p.rank], "rank"
        elif p.local_rank is not None:
            targets, scope = [r for r in pool if r.identity.local_rank == p.local_rank], "rank"
        else:
            targets, scope = pool, ("rank" if len(file_ranks) == 1 else "job")

        phase = match_phase(p.text) if live else None  # history says nothing about now
        if phase:
            seen = {"phase": phase, "seen_at": now, "line": p.text.strip()[:LINE_MAX]}
            for proc in targets:
                self._ranks.setdefault(proc.pid, _RankLog()).phase = seen

        writer = (p.rank, p.local_rank)
        progress = match_progress(p.text, self.user_pattern)
        points = [(progress, now)] if progress else []
        if progress is None and self.user_pattern is None:
            points = self._learned(entry, writer, p.text, now)
        if points:
            progress = points[-1][0]
            for proc in targets:
                state = self._ranks.setdefault(proc.pid, _RankLog())
                tracker = state.progress.setdefault(scope, ProgressTracker(scope))
                known = {t.step for t in state.progress.values() if t.events}
                for point, at in points:
                    tracker.add(point, at, entry.tailer.path, p.text, live)
                if progress.step not in known:
                    # A new step number (even on a line that also prints "val_loss"): no
                    # phase now. "eval step 40 batch 3" repeats the step, so it stays.
                    state.phase = None
            return []

        dtype = match_dtype(p.text)
        if dtype:
            for proc in targets:
                self._ranks.setdefault(proc.pid, _RankLog()).dtype = (dtype, p.text.strip()[:LINE_MAX])

        tracker = entry.tracebacks.setdefault(writer, TracebackTracker())
        error = tracker.feed(p.text)
        if error and scope == "rank":  # unprefixed errors in a shared log: the launcher's own
            for proc in targets:
                self._ranks.setdefault(proc.pid, _RankLog()).errors.append(error)
        if p.rank is None and p.local_rank is None:
            failure = entry.launcher.feed(p.text)
            if failure:
                return [failure]
        return []
