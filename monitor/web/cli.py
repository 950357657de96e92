"""``hangwatch-monitor``: serve the monitor on uvicorn (one worker: metrics come from in-process state)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn

import uvicorn

from hangwatch_common.cli_common import add_version_option
from hangwatch_common.env_names import unknown_variables_warning
from hangwatch_common.logs import configure_logging, uvicorn_log_options
from hangwatch_common.settings import add_flags, given
from monitor.web.app import create_app
from monitor.web.auth import TokenFileError
from monitor.web.http_guard import connection_cap, guarded_protocol, raise_open_file_limit
from monitor.web.log_limit import limit_repeated_logs
from monitor.web.settings import Settings, SettingsError
from monitor.storage.store import open_store

PROG = "hangwatch-monitor"
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: scripts and units read the reason at a glance.
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Central hang-detection monitor for distributed PyTorch training. "
                     "Each setting is also read from its HANGWATCH_* variable and from the --config file; "
                     "the option wins, then the variable, then the file.")
    add_version_option(parser)
    add_flags(parser, Settings)
    return parser


def _quiet_exit(signum: int, frame: FrameType | None) -> None:
    # Installed before uvicorn runs: it covers start-up, and uvicorn re-raises the SIGTERM
    # it captured once it has shut down cleanly, which then lands here as exit status 0.
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    values, typed = given(parser.parse_args(argv))
    try:
        settings = Settings.load(values, option_names=typed)
        disk_problem = settings.prepare_db_dir()
    except SettingsError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    configure_logging(settings.log_level, settings.log_format)
    if settings.config:
        logging.getLogger("hangwatch.monitor").info("settings from %s (and the flags and variables given)",
                                                    settings.config)
    signal.signal(signal.SIGTERM, _quiet_exit)
    # A misspelt setting (TOKEN_FLE for TOKEN_FILE) is otherwise ignored without a word.
    unknown = unknown_variables_warning(os.environ)
    if unknown:
        logging.getLogger("hangwatch.monitor").warning("%s", unknown)
    if disk_problem:
        logging.getLogger("hangwatch.monitor").error("%s: the history will be held in memory", disk_problem)
    store = open_store(settings)  # a database it cannot use: history in memory, said on /metrics
    try:
        try:
            app = create_app(settings, store)
        except TokenFileError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        # The settings are the connection limits (Settings inherits ConnectionLimits).
        protocol = guarded_protocol(settings, connection_cap(settings, raise_open_file_limit()), app.state.http_stats)
        limit_repeated_logs()
        ssl = {"ssl_certfile": str(settings.ssl_certfile), "ssl_keyfile": str(settings.ssl_keyfile)} \
            if settings.ssl_certfile else {}
        uvicorn.run(app, host=settings.host, port=settings.port, workers=1, http=protocol, **ssl,
                    **uvicorn_log_options(settings.log_level, settings.log_format))
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
