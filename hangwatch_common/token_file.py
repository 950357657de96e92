"""The bearer token the agent shows the monitor, read from a file (--token-file, HANGWATCH_TOKEN_FILE).

Never from the command line: every user of the node can read /proc/PID/cmdline. Never logged.
The file holds one token (surrounding whitespace and the final newline are dropped) and must
be closed to group and others (``chmod 600``): a token any local user can read is anyone's.

The file is re-read when it changes (hangwatch_common/watched_file.py), so a token is rotated without a
restart; a changed file that cannot be used keeps the last good token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hangwatch_common.watched_file import RELOAD_CHECK_S, SecretFileError, Signature, WatchedFile, read_private

log = logging.getLogger(__name__)

__all__ = ["RELOAD_CHECK_S", "TokenFileError", "TokenSource", "read_token", "token_from"]

MAX_TOKEN_FILE_BYTES = 4096
TokenFileError = SecretFileError


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


def read_token(path: str) -> tuple[str, Signature]:
    """(token, the file's signature when read). Raises TokenFileError."""
    data, signature = read_private(path, MAX_TOKEN_FILE_BYTES)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise TokenFileError(f"token file {path} must hold one token: printable ASCII") from None
    return token_from(text, 0o600, path), signature


class TokenSource(WatchedFile[str]):
    """The current token of one file; shared by every sender thread. Raises TokenFileError at
    construction when the file is unusable (a start-up error), never afterwards."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic):
        super().__init__(path, read_token, logger=log, keeping="still sending the last good token", clock=clock)
