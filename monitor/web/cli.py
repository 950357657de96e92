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
from monitor.web.app import create_app
from monitor.web.auth import TokenFileError
from monitor.web.http_guard import ConnectionLimits, connection_cap, guarded_protocol, raise_open_file_limit
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
    parser = _Parser(prog=PROG, description="Central hang-detection monitor for distributed PyTorch training.")
    add_version_option(parser)
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1, env HANGWATCH_HOST)")
    parser.add_argument("--port", help="port to listen on (default 8787, env HANGWATCH_PORT)")
    parser.add_argument("--db", help="SQLite file (default $HANGWATCH_STATE_DIR/monitor.db or the XDG state dir)")
    parser.add_argument("--log-level", help="critical, error, warning, info, debug (default info)")
    parser.add_argument("--max-body-bytes", help="largest accepted report (default 8 MiB)")
    parser.add_argument("--job-retention", dest="job_retention_s", help="seconds an ended or silent job stays shown")
    parser.add_argument("--straggler-window", dest="straggler_window_s",
                        help="seconds of CPU readings that name the rank setting a stepping job's pace (default 30)")
    parser.add_argument("--snapshot-interval", dest="snapshot_interval_s",
                        help="seconds between stored snapshots of a node (default 60)")
    parser.add_argument("--verdict-retention", dest="verdict_retention_s",
                        help="seconds verdict changes are kept (default 30 days)")
    parser.add_argument("--suspect-window", dest="suspect_window_s",
                        help="seconds over which a node's incidents make it a suspect, for /metrics and the "
                             "drain-candidate alert (default 7 days)")
    parser.add_argument("--actions", dest="actions_file",
                        help="opt-in actions on verdicts: a TOML file of rules (command, webhook, or signals the "
                             "agents send); dry run unless it says dry_run = false (env HANGWATCH_ACTIONS_FILE; "
                             "see docs/runbook.md, Acting on verdicts)")
    parser.add_argument("--capture-after", dest="capture_after_s",
                        help="seconds an incident's verdict holds before its agents are asked for a capture "
                             "(native stacks, Flight Recorder, NCCL RAS, log tails; default 15; 0: never; env "
                             "HANGWATCH_CAPTURE_AFTER_S)")
    parser.add_argument("--capture-dir", help="where capture bundles are kept (default: captures/ beside the database)")
    parser.add_argument("--token-file", help="agents' tokens, one per line: TOKEN, or NODE TOKEN to bind it to a "
                        "node (env HANGWATCH_TOKEN_FILE; unset: reports are not authenticated)")
    parser.add_argument("--read-token-file", help="tokens for the page, /diagnose and /api (env "
                        "HANGWATCH_READ_TOKEN_FILE; unset: reads are open)")
    parser.add_argument("--metrics-token-file", help="tokens for /metrics (env HANGWATCH_METRICS_TOKEN_FILE; "
                        "unset: /metrics is open)")
    parser.add_argument("--relay-token-file", help="tokens of relays (hangwatch-relay), whose checks of node-bound "
                        "agent tokens the monitor then believes (env HANGWATCH_RELAY_TOKEN_FILE)")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM; with --ssl-keyfile)")
    parser.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    parser.add_argument("--max-connections", help="open connections at most (default 4096, kept under the "
                        "open-file limit)")
    parser.add_argument("--grafana-url", help="a Grafana dashboard linked from the status page; {job} in it is "
                        "replaced by the job's id (env HANGWATCH_GRAFANA_URL)")
    parser.add_argument("--runbook-url", help="the runbook (docs/runbook.md where your people read it) linked "
                        "from the status page, with each verdict's section (env HANGWATCH_RUNBOOK_URL)")
    return parser


def option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """setting -> the option that sets it (``job_retention_s`` -> ``--job-retention``), for error messages."""
    return {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}


def _quiet_exit(signum: int, frame: FrameType | None) -> None:
    # Installed before uvicorn runs: it covers start-up, and uvicorn re-raises the SIGTERM
    # it captured once it has shut down cleanly, which then lands here as exit status 0.
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.load(vars(args), option_names=option_names(parser))
        disk_problem = settings.prepare_db_dir()
    except SettingsError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    logging.basicConfig(level=settings.log_level.upper() if settings.log_level != "trace" else "DEBUG",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
        limits = ConnectionLimits(settings.max_connections, settings.header_timeout_s, settings.body_timeout_s,
                                  settings.max_header_bytes, settings.max_headers)
        protocol = guarded_protocol(limits, connection_cap(limits, raise_open_file_limit()), app.state.http_stats)
        limit_repeated_logs()
        ssl = {"ssl_certfile": str(settings.ssl_certfile), "ssl_keyfile": str(settings.ssl_keyfile)} \
            if settings.ssl_certfile else {}
        # No access log below debug: 1,250 posts a second would be as many log lines.
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, workers=1,
                    access_log=settings.log_level in ("debug", "trace"), http=protocol, **ssl)
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
