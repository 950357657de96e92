"""The error file torch's ``@record`` writes when a rank dies of an exception.

torchrun gives every worker TORCHELASTIC_ERROR_FILE
(``/tmp/torchelastic_XXXX/<run id>_YYYY/attempt_N/<local rank>/error.json``); a
``@record``-decorated main writes it before the process exits, and the file stays
after torchrun is gone. Real content (torch 2.13)::

    {"message": {"message": "ValueError: bad shard count 3",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File ...",
                               "timestamp": "1795307395"}}}

This is what "ChildFailedError with no detail" hides. Read once per exit.
"""

from __future__ import annotations

import json

from agent.logpatterns import json_object

MAX_FILE_BYTES = 1024 * 1024
MAX_MESSAGE = 8192
CALLSTACK_LINES = 8


def parse_error_file(text: str, path: str) -> dict | None:
    """The ErrorFileReport dict: the exception line, then the callstack's last lines."""
    data = json_object(text)
    if data is None:
        return None
    message = data.get("message")
    extra: dict = {}
    if isinstance(message, dict):
        extra = message.get("extraInfo") if isinstance(message.get("extraInfo"), dict) else {}
        message = message.get("message")
    if not isinstance(message, str):
        message = "" if message is None else json.dumps(message)
    callstack = extra.get("py_callstack") if isinstance(extra.get("py_callstack"), str) else ""
    tail = [ln.rstrip() for ln in callstack.splitlines() if ln.strip()]
    if tail and tail[-1].strip() == message.strip():
        tail.pop()  # the callstack ends with the same exception line
    tail = [ln for ln in tail if ln.strip("^~ ")][-CALLSTACK_LINES:]  # drop 3.11's ^^^ markers
    text_out = "\n".join([message.strip()] + tail)
    if len(text_out) > MAX_MESSAGE:
        text_out = text_out[: MAX_MESSAGE - 3] + "..."
    try:
        timestamp = float(extra["timestamp"])
    except (KeyError, TypeError, ValueError):
        timestamp = None
    return {"path": path[:1024], "message": text_out, "timestamp": timestamp}


def read_error_file(path: str) -> dict | None:
    """None when the file is absent (the rank did not use @record, or did not fail)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES)  # a longer one would not parse anyway
    except OSError:
        return None
    return parse_error_file(data.decode("utf-8", "replace"), path)
