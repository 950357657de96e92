"""What the agent's and the operator's command lines share: one-line usage errors, the token and
CA options, and the TLS setting built from them."""

from __future__ import annotations

import argparse
import re
import ssl


class UsageError(Exception):
    """A bad command line or setting: one line for a person, exit 2."""


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, unless its help already says it or there is none to
    show (None, off, an empty list: the help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # By identity: 0 is a default worth showing, though it equals False.
        shown = not any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS)) \
            and action.default != []
        if shown and action.option_strings and "default" not in text.lower():
            text += " (default: %(default)s)"
        return text


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage block
        # "--tok=X" is ambiguous (--token, --token-file): never echo what may be the token.
        raise UsageError(re.sub(r"^(ambiguous option: -[^=\s]*)=\S*", r"\1=...", message))


class _RefuseToken(argparse.Action):
    """--token VALUE: refused without echoing VALUE (it would land in shell history, /proc and logs)."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError("the token is never taken on the command line (any user of the machine can read it "
                         "there): put it in a file only its user can read (chmod 600) and pass --token-file PATH")


def add_version_option(parser: argparse.ArgumentParser) -> None:
    from hangwatch_common.version import version_line

    parser.add_argument("--version", action="version", version=version_line(parser.prog))


def add_refused_token_option(parser: argparse.ArgumentParser) -> None:
    """A --token that is refused, naming --token-file instead."""
    parser.add_argument("--token", action=_RefuseToken, nargs="?", help=argparse.SUPPRESS)


def add_access_options(parser: argparse.ArgumentParser, token_help: str) -> None:
    """--token-file, --ca-file, and a --token that is refused."""
    parser.add_argument("--token-file", default=None, metavar="PATH", help=token_help)
    add_refused_token_option(parser)
    parser.add_argument("--ca-file", default=None, metavar="PATH",
                        help="CA bundle that verifies an https monitor's certificate (instead of the default "
                             "bundle); default: $HANGWATCH_CA_FILE")


def given_by(option: str, variable: str, value: object) -> str:
    """How an error names a setting: the option when it was given, else the variable it came from."""
    return option if value else variable


def tls_context(ca_file: str) -> ssl.SSLContext:
    """Verification against this CA bundle alone (a private CA), not the system's.
    Raises OSError or ssl.SSLError for a missing or certificate-less file."""
    return ssl.create_default_context(cafile=ca_file)


def tls_verify(ca_file: str | None, named: str = "--ca-file") -> ssl.SSLContext | bool:
    """httpx's ``verify``: the CA bundle's context, or the default bundle. Raises UsageError naming
    the setting as ``named`` (``--ca-file`` or ``HANGWATCH_CA_FILE``)."""
    if not ca_file:
        return True
    try:
        return tls_context(ca_file)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"{named} {ca_file}: {getattr(e, 'strerror', None) or e}") from None
