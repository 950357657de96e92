"""The daemons' TOML config file (``--config FILE``, ``HANGWATCH_CONFIG``): the settings' own names as
keys, read below the flags and the variables (hangwatch_common/settings.py gathers the three).

    port = 8787                     # a daemon's settings at the top level ...
    log_format = "json"
    [monitor]                       # ... or in its table, so that one file serves several daemons
    max_jobs = 2000
    [agent]
    monitor = ["http://monitor:8787"]

A daemon reads the top level and its own table (``monitor``, ``relay`` or ``agent``; the table wins),
and leaves the other daemons' tables to them. Each value is handed on as the text a flag would give
(an array as the values of a repeated flag), so that it goes through the same conversion and bounds;
a key the daemon does not know is an error naming the setting it most resembles, since a misspelt
key would otherwise change nothing without a word.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hangwatch_common.cli_common import UsageError

# The tables that hold one daemon's settings.
DAEMON_TABLES = ("monitor", "relay", "agent")
CONFIG_KEY = "config"  # the setting that names the file
CLOSE_ENOUGH = 0.75


class ConfigFileError(UsageError, ValueError):
    """A config file that cannot be read or says something no setting means: one line naming the file."""


def read_document(path: Path) -> dict[str, Any]:
    """The parsed TOML file; ConfigFileError (one line) if it is missing, unreadable or not TOML."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise ConfigFileError(f"{path}: a config file needs Python 3.11 or the tomli package") from None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path}: not TOML: not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: not TOML: {' '.join(str(exc).split())}") from None


def file_settings(document: Mapping[str, Any], table: str, repeats: Mapping[str, bool],
                  where: str) -> dict[str, tuple[Any, str]]:
    """setting -> (its value as a flag would give it, how an error names it: ``FILE: key``), for the
    daemon whose table is ``table`` and whose settings are ``repeats`` (name -> whether it repeats).
    ``where``: the file as errors name it."""
    found: dict[str, tuple[Any, str]] = {}
    own = document.get(table, {})
    for prefix, part in (("", document), (f"{table}.", own if isinstance(own, dict) else {})):
        for key, value in part.items():
            if not prefix and key in DAEMON_TABLES and isinstance(value, dict):
                continue  # a daemon's table: this daemon's is read next, the others are theirs
            named = f"{where}: {prefix}{key}"
            if key == CONFIG_KEY:
                raise ConfigFileError(f"{named}: a config file cannot name another (give --config or HANGWATCH_CONFIG)")
            if key not in repeats:
                raise ConfigFileError(f"{named}: {_unknown(key, repeats, table)}")
            found[key] = (_as_given(value, repeats[key], named), named)
    return found


def _unknown(key: str, known: Mapping[str, bool], table: str) -> str:
    guess = _closest(key, known)
    return f"hangwatch-{table} has no such setting" + (f" (did you mean {guess}?)" if guess else "")


def _closest(key: str, known: Mapping[str, bool]) -> str | None:
    # The flag's spelling (capture-after) and the name without its unit are the likeliest slips.
    spelt = key.replace("-", "_").lower()
    for candidate in (spelt, spelt + "_s"):
        if candidate in known:
            return candidate
    close = difflib.get_close_matches(spelt, sorted(known), n=1, cutoff=CLOSE_ENOUGH)
    return close[0] if close else None


def _as_given(value: Any, repeated: bool, named: str) -> Any:
    """A TOML value as the text a flag gives (a list of texts for a repeated setting)."""
    if isinstance(value, list):
        if not repeated:
            raise ConfigFileError(f"{named} takes one value, not an array")
        return [_text(item, named) for item in value]
    text = _text(value, named)
    return [text] if repeated else text


def _text(value: Any, named: str) -> str:
    if isinstance(value, bool):  # before int: True is an int
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    kind = "a table" if isinstance(value, dict) else "an array" if isinstance(value, list) else type(value).__name__
    raise ConfigFileError(f"{named} must be a string, a number, true or false (or an array of them), not {kind}")
