"""The bearer token the agent shows the monitor, read from a file (--token-file, HANGWATCH_TOKEN_FILE).

Never from the command line: every user of the node can read /proc/PID/cmdline. Never logged.
The file holds one token (surrounding whitespace and the final newline are dropped) and must
be closed to group and others (``chmod 600``): a token any local user can read is anyone's.

The file is checked again at most every RELOAD_CHECK_S and re-read when it changed (inode,
size, mtime or ctime: an edit, a rename over it, a chmod, a Kubernetes Secret update), so a
token is rotated without a restart. A changed file that cannot be used keeps the last good
token, logged once per problem: a botched edit must not cut the node off the monitor.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 1.0
MAX_TOKEN_FILE_BYTES = 4096


class TokenFileError(Exception):
    """A token file that cannot be used; the message is one line meant for a person."""


def token_from(text: str, mode: int, path: str) -> str:
    """The token in a file's text, given the file's st_mode. Raises TokenFileError."""
    if mode & 0o077:
        raise TokenFileError(
            f"token file {path} is open to group or others (mode {mode & 0o777:04o}): chmod 600 {path}"
        )
    token = text.strip()
    if not token:
        raise TokenFileError(f"token file {path} is empty")
    # It goes into an HTTP header as is: one line of printable ASCII, nothing else.
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise TokenFileError(f"token file {path} must hold one token: printable ASCII, no spaces or line breaks")
    return token


def _signature(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_token(path: str) -> tuple[str, tuple[int, ...]]:
    """(token, the file's signature when read). Raises TokenFileError."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())  # the file read, even when the path is a symlink
            data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as e:
        raise TokenFileError(f"cannot read token file {path}: {e.strerror or e}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenFileError(f"token file {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes: not one token")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise TokenFileError(f"token file {path} must hold one token: printable ASCII") from None
    return token_from(text, st.st_mode, path), _signature(st)


class TokenSource:
    """The current token of one file; shared by every sender thread. Raises TokenFileError at
    construction when the file is unusable (a start-up error), never afterwards."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.clock = clock
        self._token, self._signature = read_token(path)
        self._checked_at = clock()
        self._problem: str | None = None
        self._lock = threading.Lock()

    def current(self) -> str:
        with self._lock:
            now = self.clock()
            if now - self._checked_at >= RELOAD_CHECK_S:
                self._checked_at = now
                self._reload_if_changed()
            return self._token

    def _reload_if_changed(self) -> None:
        try:
            signature = _signature(os.stat(self.path))
        except OSError as e:
            self._note_problem(f"cannot read token file {self.path}: {e.strerror or e}")
            return
        if signature == self._signature:
            return
        try:
            token, self._signature = read_token(self.path)
        except TokenFileError as e:
            self._signature = signature  # not again until it changes again
            self._note_problem(str(e))
            return
        changed = token != self._token
        self._token, self._problem = token, None
        if changed:
            log.info("token file %s changed: sending the new token", self.path)

    def _note_problem(self, problem: str) -> None:
        if problem != self._problem:
            log.warning("%s; still sending the last good token", problem)
            self._problem = problem
