"""What the agent's and the operator's command lines share: one-line usage errors, the token and
CA options, and the TLS setting built from them."""

from __future__ import annotations

import argparse
import re
import ssl


class UsageError(Exception):
    """A bad command line or setting: one line for a person, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage block
        # "--tok=X" is ambiguous (--token, --token-file): never echo what may be the token.
        raise UsageError(re.sub(r"^(ambiguous option: -[^=\s]*)=\S*", r"\1=...", message))


class _RefuseToken(argparse.Action):
    """--token VALUE: refused without echoing VALUE (it would land in shell history, /proc and logs)."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError("the token is never taken on the command line (any user of the machine can read it "
                         "there): put it in a file only its user can read (chmod 600) and pass --token-file PATH")


def add_access_options(parser: argparse.ArgumentParser, token_help: str) -> None:
    """--token-file, --ca-file, and a --token that is refused."""
    parser.add_argument("--token-file", default=None, metavar="PATH", help=token_help)
    parser.add_argument("--token", action=_RefuseToken, nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--ca-file", default=None, metavar="PATH",
                        help="CA bundle that verifies an https monitor's certificate (instead of the default "
                             "bundle); default: $HANGWATCH_CA_FILE")


def tls_verify(ca_file: str | None) -> ssl.SSLContext | bool:
    """httpx's ``verify``: the CA bundle's context, or the default bundle. Raises UsageError."""
    if not ca_file:
        return True
    from agent.sender import tls_context

    try:
        return tls_context(ca_file)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"--ca-file {ca_file}: {getattr(e, 'strerror', None) or e}") from None
