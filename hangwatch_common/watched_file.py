"""A secret file that is re-read when it changes, for the agent's token and the monitor's tokens.

The file is looked at at most every RELOAD_CHECK_S and re-read when its signature changed
(device, inode, size, mtime or ctime: an edit, a rename over it, a chmod, a Kubernetes Secret
update whose symlink swap keeps the mtime), so secrets rotate without a restart. A changed file
that cannot be used keeps the last good value, logged once per problem: a botched edit must not
cut a node off the monitor, nor lock every agent out.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

RELOAD_CHECK_S = 1.0

Value = TypeVar("Value")
Signature = tuple[int, ...]


class SecretFileError(Exception):
    """A secret file that cannot be used; the message is one line meant for a person."""


def signature_of(st: os.stat_result) -> Signature:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_private(path: str, max_bytes: int) -> tuple[bytes, Signature]:
    """The bytes of a file closed to group and others, and its signature. Raises SecretFileError."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())  # the file read, even when the path is a symlink
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise SecretFileError(f"cannot read token file {path}: {e.strerror or e}") from None
    if st.st_mode & 0o077:
        raise SecretFileError(f"token file {path} is open to group or others "
                              f"(mode {st.st_mode & 0o777:04o}): chmod 600 {path}")
    if len(data) > max_bytes:
        raise SecretFileError(f"token file {path} is larger than {max_bytes} bytes")
    return data, signature_of(st)


class WatchedFile(Generic[Value]):
    """The current value of one file, ``load(path) -> (value, signature)``; thread-safe.

    Raises SecretFileError at construction when the file is unusable (a start-up error: a
    daemon must not come up without its secret, or open by mistake), never afterwards.
    """

    def __init__(self, path: str, load: Callable[[str], tuple[Value, Signature]], *, logger: logging.Logger,
                 keeping: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self._load, self._log, self._keeping, self._clock = path, load, logger, keeping, clock
        self._value, self._signature = load(path)
        self._checked_at = clock()
        self._problem: str | None = None
        self._lock = threading.Lock()

    def current(self) -> Value:
        with self._lock:
            now = self._clock()
            if now - self._checked_at >= RELOAD_CHECK_S:
                self._checked_at = now
                self._reload_if_changed()
            return self._value

    def _reload_if_changed(self) -> None:
        try:
            signature = signature_of(os.stat(self.path))
        except OSError as e:
            self._note_problem(f"cannot read token file {self.path}: {e.strerror or e}")
            return
        if signature == self._signature:
            return
        try:
            value, self._signature = self._load(self.path)
        except SecretFileError as e:
            self._signature = signature  # not again until it changes again
            self._note_problem(str(e))
            return
        changed = value != self._value
        self._value, self._problem = value, None
        if changed:
            self._log.info("token file %s changed and was re-read", self.path)

    def _note_problem(self, problem: str) -> None:
        if problem != self._problem:
            self._log.warning("%s; %s", problem, self._keeping)
            self._problem = problem
