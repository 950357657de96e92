"""``hangwatch-relay``: take a share of the nodes' reports and forward them to the monitor in batches.

    hangwatch-relay --monitor http://monitor:8787 [--port 8788] [--token-file agents.tokens]
                    [--relay-token-file relay.token] [--summarise [--summarise-ranks 512]]

Agents are pointed at the relay (``hangwatch-agent --monitor http://relay:8788``) instead of the
monitor; docs/scaling.md says when a job needs relays and how many.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import ClassVar, NoReturn

import uvicorn

from hangwatch_common.cli_common import add_version_option
from hangwatch_common.env_names import unknown_variables_warning
from hangwatch_common.logs import configure_logging, uvicorn_log_options
from hangwatch_common.settings import DaemonSettings, SettingsError, add_flags, load, setting
from hangwatch_common.token_file import TokenSource
from hangwatch_common.watched_file import SecretFileError
from monitor.engine.summaries import RELAY_NAME
from monitor.web.auth import INGEST, METRICS, AuthLayer, TokenFile
from monitor.web.http_guard import ConnectionLimits, HttpStats, connection_cap, guarded_protocol, raise_open_file_limit
from monitor.web.log_limit import limit_repeated_logs
from monitor.relay.app import RelayApp
from monitor.relay.forwarder import FLUSH_S, Forwarder
from monitor.relay.summariser import SUMMARISE_RANKS, Summariser, default_name

PROG = "hangwatch-relay"
EXIT_USAGE = 2


def _web_address(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise ValueError("must be the monitor's http:// or https:// address")
    return text


def _relay_name(text: str) -> str:
    if not RELAY_NAME.fullmatch(text):
        raise ValueError("must be 1-200 characters of A-Z a-z 0-9 _ . : - (the monitor refuses other names)")
    return text


@dataclass(frozen=True)
class RelaySettings(ConnectionLimits, DaemonSettings):
    config_table: ClassVar[str] = "relay"
    monitor: str | None = setting(None, parse=_web_address, help="the monitor's base URL", shown_default="none: "
                                  "required")
    host: str = setting("127.0.0.1", help="address to listen on")
    port: int = setting(8788, help="port to listen on", at_least=1, at_most=65535)
    token_file: str | None = setting(None, metavar="PATH", help="the agents' tokens, as the monitor's --token-file "
                                     "(NODE TOKEN lines bind a node)")
    metrics_token_file: str | None = setting(None, metavar="PATH", help="tokens for the relay's /metrics")
    relay_token_file: str | None = setting(None, metavar="PATH", help="the token this relay presents to the monitor: "
                                           "one of the monitor's --relay-token-file (then it believes the relay's node "
                                           "checks), else an ingest token")
    ca_file: str | None = setting(None, metavar="PATH", help="the CA that signed an https:// monitor's certificate, "
                                  "when private")
    ssl_certfile: str | None = setting(None, metavar="PATH", help="serve agents over HTTPS with this certificate (PEM; "
                                       "with --ssl-keyfile)")
    ssl_keyfile: str | None = setting(None, metavar="PATH", help="the certificate's private key")
    max_body_bytes: int = setting(8 * 1024 * 1024, at_least=1024, help="largest accepted report: no more than the "
                                  "monitor's own limit, which also bounds each batch (its limit plus the batch's "
                                  "framing)")
    flush_ms: float = setting(FLUSH_S * 1000, at_least=0, help="how long a batch gathers reports before it is sent")
    # docs/scaling.md, "One job of 100,000 ranks": the owner cannot apply every report of such a job.
    summarise: bool = setting(False, help="keep the picture of giant jobs here and send the monitor a summary of "
                              "each (its ranks grouped) instead of their reports; smaller jobs' reports are forwarded")
    summarise_ranks: int = setting(SUMMARISE_RANKS, at_least=1, help="with --summarise, a job of this world size or "
                                   "more is summarised")
    summary_interval_s: float = setting(1.0, positive=True, help="with --summarise, seconds between summaries")
    name: str | None = setting(None, parse=_relay_name, help="with --summarise, the relay's name in its summaries: "
                               "stable across restarts, unique among the monitor's relays",
                               shown_default="the host name and the port, as HOST:PORT")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Forward a share of the nodes' reports to the hangwatch monitor "
                                            "in batches (one giant job's first level of ingest). Each setting is "
                                            "also read from its HANGWATCH_* variable and from the --config file; "
                                            "the option wins, then the variable, then the file.")
    add_version_option(parser)
    add_flags(parser, RelaySettings)
    return parser


def load_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> RelaySettings:
    """The relay's settings from the command line and the environment (os.environ); SettingsError if one is bad."""
    return load(RelaySettings, build_parser().parse_args(argv), os.environ if env is None else env)


def _quiet_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except SettingsError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not settings.monitor:
        print(f"{PROG}: error: --monitor must be the monitor's http:// or https:// address", file=sys.stderr)
        return EXIT_USAGE
    if bool(settings.ssl_certfile) != bool(settings.ssl_keyfile):
        print(f"{PROG}: error: --ssl-certfile and --ssl-keyfile go together", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.log_level, settings.log_format)
    if settings.config:
        logging.getLogger("hangwatch.relay").info("settings from %s (and the flags and variables given)",
                                                  settings.config)
    signal.signal(signal.SIGTERM, _quiet_exit)
    unknown = unknown_variables_warning(os.environ)  # a misspelt setting otherwise changes nothing, silently
    if unknown:
        logging.getLogger("hangwatch.relay").warning("%s", unknown)
    if settings.relay_token_file and not settings.token_file:
        # The monitor has tokens (else why a relay token): an open relay would post anyone's reports with its own.
        print(f"{PROG}: error: --relay-token-file without --token-file would forward anyone's reports with the "
              "relay's token: give the agents' token file (the monitor's --token-file)", file=sys.stderr)
        return EXIT_USAGE
    try:
        # The relay's own token (one per file, like an agent's), re-read when the file changes.
        token = TokenSource(settings.relay_token_file) if settings.relay_token_file else None
        files = {kind: TokenFile(Path(path), allow_nodes=kind == INGEST)
                 for kind, path in ((INGEST, settings.token_file), (METRICS, settings.metrics_token_file)) if path}
    except SecretFileError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=settings.ca_file) if settings.ca_file else True
    forwarder = Forwarder(settings.monitor, token.current if token is not None else lambda: None,
                          max_batch_bytes=settings.max_body_bytes, flush_s=settings.flush_ms / 1000, verify=verify)
    name = settings.name or default_name(settings.port)
    if settings.summarise and not RELAY_NAME.fullmatch(name):
        print(f"{PROG}: error: the host name makes a relay name the monitor refuses ({name!r}): give --name",
              file=sys.stderr)
        return EXIT_USAGE
    summariser = Summariser(name, settings.summarise_ranks) if settings.summarise else None
    relay = RelayApp(forwarder, max_body_bytes=settings.max_body_bytes, summariser=summariser,
                     summary_interval_s=settings.summary_interval_s)
    stats = HttpStats()
    if INGEST not in files:
        logging.getLogger("hangwatch.relay").warning(
            "no token file: any client that reaches the relay can post reports (see --token-file)")

    def refused(kind: str) -> None:
        if kind == INGEST:  # a report refused; a scrape of /metrics without its token is no report
            relay.reject("unauthorized")

    app = AuthLayer(relay, files, on_refused=refused) if files else relay
    limits = settings  # RelaySettings inherits ConnectionLimits
    limit_repeated_logs()
    try:
        uvicorn.run(app, host=settings.host, port=settings.port,
                    http=guarded_protocol(limits, connection_cap(limits, raise_open_file_limit()), stats),
                    lifespan="on", ssl_certfile=settings.ssl_certfile, ssl_keyfile=settings.ssl_keyfile,
                    **uvicorn_log_options(settings.log_level, settings.log_format))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
