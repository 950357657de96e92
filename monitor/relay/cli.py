"""``hangwatch-relay``: take a share of the nodes' reports and forward them to the monitor in batches.

    hangwatch-relay --monitor http://monitor:8787 [--port 8788] [--token-file agents.tokens]
                    [--relay-token-file relay.token]

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
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

import uvicorn

from hangwatch_common.cli_common import add_version_option
from hangwatch_common.token_file import TokenSource
from hangwatch_common.watched_file import SecretFileError
from monitor.web.auth import INGEST, METRICS, AuthLayer, TokenFile
from monitor.web.http_guard import ConnectionLimits, HttpStats, connection_cap, guarded_protocol, raise_open_file_limit
from monitor.web.log_limit import limit_repeated_logs
from monitor.relay.app import RelayApp
from monitor.relay.forwarder import FLUSH_S, Forwarder

PROG = "hangwatch-relay"
EXIT_USAGE = 2
DEFAULT_PORT = 8788
MAX_BODY_BYTES = 8 * 1024 * 1024


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = _Parser(prog=PROG, description="Forward a share of the nodes' reports to the hangwatch monitor "
                                            "in batches (one giant job's first level of ingest).")
    add_version_option(parser)
    parser.add_argument("--monitor", default=env("HANGWATCH_MONITOR"),
                        help="the monitor's base URL (env HANGWATCH_MONITOR)")
    parser.add_argument("--host", default=env("HANGWATCH_HOST", "127.0.0.1"), help="address to listen on")
    parser.add_argument("--port", type=int, default=int(env("HANGWATCH_PORT", DEFAULT_PORT)),
                        help=f"port to listen on (default {DEFAULT_PORT})")
    parser.add_argument("--token-file", default=env("HANGWATCH_TOKEN_FILE"),
                        help="the agents' tokens, as the monitor's --token-file (NODE TOKEN lines bind a node)")
    parser.add_argument("--metrics-token-file", default=env("HANGWATCH_METRICS_TOKEN_FILE"),
                        help="tokens for the relay's /metrics")
    parser.add_argument("--relay-token-file", default=env("HANGWATCH_RELAY_TOKEN_FILE"),
                        help="the token this relay presents to the monitor: one of the monitor's "
                             "--relay-token-file (then it believes the relay's node checks), else an ingest token")
    parser.add_argument("--ca-file", default=env("HANGWATCH_CA_FILE"),
                        help="the CA that signed an https:// monitor's certificate, when private")
    parser.add_argument("--ssl-certfile", default=env("HANGWATCH_SSL_CERTFILE"),
                        help="serve agents over HTTPS with this certificate (PEM; with --ssl-keyfile)")
    parser.add_argument("--ssl-keyfile", default=env("HANGWATCH_SSL_KEYFILE"), help="the certificate's private key")
    parser.add_argument("--max-body-bytes", type=int, default=int(env("HANGWATCH_MAX_BODY_BYTES", MAX_BODY_BYTES)),
                        help="largest accepted report (default 8 MiB): no more than the monitor's own limit, "
                             "which also bounds each batch (its limit plus the batch's framing)")
    parser.add_argument("--flush-ms", type=float, default=FLUSH_S * 1000,
                        help="how long a batch gathers reports before it is sent (default %(default)g)")
    parser.add_argument("--log-level", default=env("HANGWATCH_LOG_LEVEL", "info"),
                        choices=("critical", "error", "warning", "info", "debug"))
    return parser


def _quiet_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.monitor or not args.monitor.startswith(("http://", "https://")):
        print(f"{PROG}: error: --monitor must be the monitor's http:// or https:// address", file=sys.stderr)
        return EXIT_USAGE
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        print(f"{PROG}: error: --ssl-certfile and --ssl-keyfile go together", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _quiet_exit)
    if args.relay_token_file and not args.token_file:
        # The monitor has tokens (else why a relay token): an open relay would post anyone's reports with its own.
        print(f"{PROG}: error: --relay-token-file without --token-file would forward anyone's reports with the "
              "relay's token: give the agents' token file (the monitor's --token-file)", file=sys.stderr)
        return EXIT_USAGE
    try:
        # The relay's own token (one per file, like an agent's), re-read when the file changes.
        token = TokenSource(args.relay_token_file) if args.relay_token_file else None
        files = {kind: TokenFile(Path(path), allow_nodes=kind == INGEST)
                 for kind, path in ((INGEST, args.token_file), (METRICS, args.metrics_token_file)) if path}
    except SecretFileError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else True
    forwarder = Forwarder(args.monitor, token.current if token is not None else lambda: None,
                          max_batch_bytes=args.max_body_bytes, flush_s=args.flush_ms / 1000, verify=verify)
    relay = RelayApp(forwarder, max_body_bytes=args.max_body_bytes)
    stats = HttpStats()
    if INGEST not in files:
        logging.getLogger("hangwatch.relay").warning(
            "no token file: any client that reaches the relay can post reports (see --token-file)")

    def refused(kind: str) -> None:
        if kind == INGEST:  # a report refused; a scrape of /metrics without its token is no report
            relay.reject("unauthorized")

    app = AuthLayer(relay, files, on_refused=refused) if files else relay
    limits = ConnectionLimits()
    limit_repeated_logs()
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                    http=guarded_protocol(limits, connection_cap(limits, raise_open_file_limit()), stats),
                    lifespan="on", ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
