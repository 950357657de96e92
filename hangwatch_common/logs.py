"""The daemons' logging: one level flag and one format for the monitor, the relay and the agent,
uvicorn's error and access lines included.

``text`` is one line a record, ``TIME LEVEL LOGGER: MESSAGE``, the same for hangwatch's lines and
uvicorn's (uvicorn's own format, ``INFO:     ...`` without a time, is not used). ``json`` is one JSON
object a line: time (ISO-8601, UTC), level, logger, message, the exception's text when there is one,
and for uvicorn's access lines the client, method, path and status as fields of their own, so a log
pipeline needs no parser of its own. Both go to stderr (the agent's ``--once`` report is stdout's).
"""

from __future__ import annotations

import json
import logging
import logging.config
from datetime import datetime, timezone
from typing import Any

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
LOG_FORMATS = ("text", "json")
# uvicorn's level below debug (each protocol event); hangwatch's own code logs nothing at it.
TRACE = 5
ACCESS_LOGGER = "uvicorn.access"


def level_number(level: str) -> int:
    """A LOG_LEVELS word as logging's number."""
    return TRACE if level == "trace" else logging.getLevelName(level.upper())


def access_log_wanted(level: str) -> bool:
    # A line per request only when asked for: 1,250 reports a second would be as many lines.
    return level in ("debug", "trace")


def _utc_time(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``2025-01-02T03:04:05.678Z INFO hangwatch.monitor: message`` (a traceback on the lines after)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return _utc_time(record)


class JsonFormatter(logging.Formatter):
    """One JSON object a record, on one line (ASCII: a control character or a stray surrogate in a
    message from a client is escaped, never a broken line)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": _utc_time(record), "level": record.levelname.lower(),
                                 "logger": record.name, "message": record.getMessage()}
        entry.update(access_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def access_fields(record: logging.LogRecord) -> dict[str, Any]:
    """An access line's parts: uvicorn logs ``'%s - "%s %s HTTP/%s" %d'`` with (client, method,
    path and query, HTTP version, status) as its arguments."""
    args = record.args
    if record.name != ACCESS_LOGGER or not isinstance(args, tuple) or len(args) != 5:
        return {}
    client, method, path, _version, status = args
    return {"client": client, "method": method, "path": path, "status": status}


FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}


def logging_config(level: str, log_format: str) -> dict[str, Any]:
    """A dictConfig for the whole process: one stderr handler on the root logger with the chosen
    formatter, uvicorn's loggers handing their records to it. Also uvicorn.run's ``log_config``, so
    uvicorn's own set-up at start leaves the same thing in place."""
    uvicorn_logger = {"handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"hangwatch": {"()": FORMATTERS[log_format]}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "hangwatch",
                                "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level_number(level)},
        "loggers": {"uvicorn": uvicorn_logger, "uvicorn.error": dict(uvicorn_logger),
                    ACCESS_LOGGER: dict(uvicorn_logger)},
    }


def configure_logging(level: str, log_format: str) -> None:
    """Log at ``level`` (a LOG_LEVELS word) in ``log_format`` (text or json) from now on."""
    logging.addLevelName(TRACE, "TRACE")
    logging.config.dictConfig(logging_config(level, log_format))


def uvicorn_log_options(level: str, log_format: str) -> dict[str, Any]:
    """uvicorn.run's logging arguments for the same level and format."""
    return {"log_config": logging_config(level, log_format), "log_level": level,
            "access_log": access_log_wanted(level)}
