"""One declaration per setting, for every daemon (uvicorn's way: one declaration, read from the
command line and the environment alike).

A daemon's settings are a frozen dataclass whose fields are ``setting(default, help=...)``. From that
one declaration come the flag (``--name``, ``_`` as ``-``, a trailing ``_s`` left to its SECONDS),
the environment variable (``HANGWATCH_<NAME>``), the key in the config file
(hangwatch_common/config_file.py), the entry in ``--help`` with the default and the variable, the
bounds checked at start, the names the misspelling warning knows (hangwatch_common/declared_names.py)
and the settings tables of docs/configuration.md (both written by scripts/settings-docs.py). A value
comes from the flag, else the variable (an empty one is unset), else the config file, else the
default; a bad one stops the daemon at start with one line naming the flag, variable or file key
that gave it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, ClassVar

from hangwatch_common.cli_common import UsageError
from hangwatch_common.config_file import CONFIG_KEY, ConfigFileError, file_settings, read_document
from hangwatch_common.logs import LOG_FORMATS, LOG_LEVELS

PREFIX = "HANGWATCH_"
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
BOOL_WORDS = "1, 0, true, false, yes, no, on, off"
_SPEC = "hangwatch.setting"  # the key of a field's metadata
_TYPED = "_typed_flags"  # where a parsed command line keeps which spelling gave each setting


class SettingsError(UsageError, ValueError):
    """A setting that cannot work: one line for a person, naming the setting as it was given
    (``HANGWATCH_PORT``, ``--port``) where that is known."""


@dataclass(frozen=True)
class Spec:
    help: str
    metavar: str | None = None
    # Older spellings of the flag, kept working.
    aliases: tuple[str, ...] = ()
    # False: no variable, only the flag (the declaration says why).
    env: bool = True
    # Bounds of a number; the words a text may be.
    at_least: float | None = None
    at_most: float | None = None
    positive: bool = False
    choices: tuple[str, ...] = ()
    # Text -> value, for a type of its own or a check beyond the bounds; ValueError("must be ...").
    parse: Callable[[str], Any] | None = None
    # The default in words, where the value does not say it (worked out at start, or None meaning something).
    shown_default: str | None = None


def setting(default: Any = MISSING, *, help: str, factory: Callable[[], Any] | None = None, **spec: Any) -> Any:
    """A dataclass field that is a setting: its default (or ``factory``), its help, and Spec's rest."""
    return dataclasses.field(default=default, default_factory=factory or MISSING,
                             metadata={_SPEC: Spec(help, **spec)})


@dataclass(frozen=True)
class Declared:
    """One setting as its daemon declares it."""

    name: str
    kind: Any  # int, float, bool, str, Path, or what spec.parse makes
    repeated: bool  # a tuple: the flag is repeated, the variable's words are the values
    field: dataclasses.Field
    spec: Spec

    @property
    def env(self) -> str | None:
        return PREFIX + self.name.upper() if self.spec.env else None

    @property
    def flags(self) -> tuple[str, ...]:
        return ("--" + self.name.removesuffix("_s").replace("_", "-"), *self.spec.aliases)

    @property
    def is_switch(self) -> bool:
        return self.kind is bool and not self.repeated

    @property
    def option_strings(self) -> tuple[str, ...]:
        """The flags, and for a switch each one's --no- form."""
        off = tuple("--no-" + f[2:] for f in self.flags if f.startswith("--")) if self.is_switch else ()
        return (*self.flags, *off)

    @property
    def default(self) -> Any:
        f = self.field
        return f.default if f.default is not MISSING else f.default_factory()

    @property
    def shown_default(self) -> str:
        """The default as --help and the README say it."""
        if self.spec.shown_default is not None:
            return self.spec.shown_default
        value = self.default
        if isinstance(value, bool):
            return "on" if value else "off"
        if value is None or value == () or value == "":
            return "unset"
        return _in_units(self.name, value) if isinstance(value, (int, float)) else str(value)

    @property
    def metavar(self) -> str:
        if self.spec.metavar:
            return self.spec.metavar
        for suffix, word in (("_s", "SECONDS"), ("_bytes", "BYTES")):
            if self.name.endswith(suffix):
                return word
        if self.kind is Path:
            return "PATH"
        return "N" if self.kind in (int, float) else self.name.rsplit("_", 1)[-1].upper()

    @property
    def described(self) -> str:
        """What it does, and the words it may be."""
        return self.spec.help + (f" (one of {', '.join(self.spec.choices)})" if self.spec.choices else "")

    @property
    def help(self) -> str:
        """The --help entry: what it does, its default and its variable."""
        return f"{self.described} (default: {self.shown_default}" + (f"; env {self.env})" if self.env else ")")


@functools.cache
def declared(cls: type) -> tuple[Declared, ...]:
    """The settings ``cls`` declares, in order: its own, then those of the classes it is made of."""
    hints = typing.get_type_hints(cls)
    own = cls.__dict__.get("__annotations__", {})
    fields = sorted(dataclasses.fields(cls), key=lambda f: f.name not in own)  # stable: each part keeps its order
    return tuple(Declared(f.name, *_kind(hints[f.name]), f, f.metadata[_SPEC]) for f in fields if _SPEC in f.metadata)


def _kind(hint: Any) -> tuple[Any, bool]:
    """(the value's type, whether it repeats) from an annotation: ``X | None`` is X, ``tuple[X, ...]`` X repeated."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return typing.get_origin(hint) or hint, False


@dataclass(frozen=True)
class DaemonSettings:
    """What every daemon takes: a config file, and how much it logs and how."""

    # The config file's table of this daemon's own settings (config_file.DAEMON_TABLES).
    config_table: ClassVar[str] = ""
    config: Path | None = setting(None, metavar="FILE", help="a TOML file of settings, keyed by the settings' names "
                                  "(port = 8787); the flags and variables win over it (docs/configuration.md)")
    log_level: str = setting("info", choices=LOG_LEVELS, help="how much the daemon logs; at debug and trace the "
                             "monitor and the relay log each HTTP request (trace: uvicorn's protocol events too; to "
                             "the agent it is debug)")
    log_format: str = setting("text", choices=LOG_FORMATS, help="text: TIME LEVEL LOGGER: MESSAGE lines; json: one "
                              "JSON object a line (time, level, logger, message), uvicorn's lines too")


# --- the command line ---

class _Flag(argparse.Action):
    """A setting's flag: a value, one more value when it repeats, or on/off as --x/--no-x; it also
    keeps which spelling gave it, so that an error names what the person typed."""

    def __init__(self, option_strings: list[str], dest: str, item: Declared, **kwargs: Any) -> None:
        self.item = item
        if item.is_switch:
            kwargs["nargs"] = 0
        else:
            kwargs["metavar"] = item.metavar
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=item.help.replace("%", "%%"), **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.item.is_switch:
            values = not (option_string or "").startswith("--no-")
        elif self.item.repeated:
            values = [*getattr(namespace, self.dest, ()), values]
        setattr(namespace, self.dest, values)
        namespace.__dict__.setdefault(_TYPED, {})[self.dest] = option_string

    def format_usage(self) -> str:  # a switch's usage: --x | --no-x
        return " | ".join(self.option_strings)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """A flag for each setting ``cls`` declares."""
    for item in declared(cls):
        parser.add_argument(*item.option_strings, dest=item.name, action=_Flag, item=item)


def given(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """(setting -> the value its flag gave, setting -> the flag as typed), for the flags given."""
    values = dict(vars(args))
    return values, values.pop(_TYPED, {})


# --- values ---

def gather(cls: type, values: Mapping[str, Any], env: Mapping[str, str],
           typed: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(setting -> raw value, setting -> what gave it): ``values`` (None is not given; ``typed`` says
    how each was spelt), else the variable (empty is unset), else the config file that one of them
    names (``config``). A setting given by none is left out."""
    raw, sources = {}, {}
    for item in declared(cls):
        if values.get(item.name) is not None:
            raw[item.name] = values[item.name]
            sources[item.name] = (typed or {}).get(item.name, item.name)
        elif item.env and env.get(item.env, "") != "":
            raw[item.name] = env[item.env]
            sources[item.name] = item.env
    if CONFIG_KEY in raw:
        for name, (value, named) in _from_file(cls, raw[CONFIG_KEY], sources[CONFIG_KEY]).items():
            if name not in raw:
                raw[name], sources[name] = value, named
    return raw, sources


def _from_file(cls: type, given: Any, named: str) -> dict[str, tuple[Any, str]]:
    """The settings the config file ``given`` (as ``named`` gave it) holds for ``cls``'s daemon."""
    known = {item.name: item for item in declared(cls)}
    path = convert(known[CONFIG_KEY], given, named)
    try:
        document = read_document(path)
    except ConfigFileError as exc:
        raise SettingsError(f"{named} {exc}") from None
    try:
        return file_settings(document, getattr(cls, "config_table", ""),
                             {name: item.repeated for name, item in known.items()}, str(path))
    except ConfigFileError as exc:
        raise SettingsError(str(exc)) from None


def build(cls: type, raw: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Any:
    """``cls`` from raw values (text, or values of the setting's type), each converted and checked;
    the rest at their defaults. ``sources``: how an error names each setting (else by its name)."""
    known = {item.name: item for item in declared(cls)}
    values = {}
    for name, value in raw.items():
        if name not in known:
            raise SettingsError(f"unknown setting {name!r}")
        values[name] = convert(known[name], value, (sources or {}).get(name, name))
    return cls(**values)


def load(cls: type, args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """``cls`` from a parsed command line and the environment."""
    values, typed = given(args)
    return build(cls, *gather(cls, values, env, typed))


def convert(item: Declared, value: Any, named: str) -> Any:
    """``value`` as ``item``'s type, within its bounds; a SettingsError naming it ``named`` if not."""
    if item.repeated:
        return tuple(_one(item, v, named) for v in (value.split() if isinstance(value, str) else value))
    return _one(item, value, named)


def _one(item: Declared, value: Any, named: str) -> Any:
    try:
        converted = _typed(item, value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{named} {exc}, not {str(value)[:64]!r}") from None
    _check(item.spec, converted, named)
    return converted


def _typed(item: Declared, value: Any) -> Any:
    if item.spec.parse is not None:
        return item.spec.parse(value) if isinstance(value, str) else value
    kind = item.kind
    if kind is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise ValueError(f"must be one of {BOOL_WORDS}")
        return word in TRUE_WORDS
    try:
        if kind is int:
            return int(value)
        if kind is float:
            number = float(value)
            if number != number:  # NaN passes every comparison with a bound
                raise ValueError
            return number
    except (TypeError, ValueError):
        raise ValueError("must be a whole number" if kind is int else "must be a number") from None
    if kind is Path:
        return Path(value).expanduser()
    return str(value)


def _check(spec: Spec, value: Any, named: str) -> None:
    if value is None:
        return
    if spec.choices and value not in spec.choices:
        raise SettingsError(f"{named} must be one of {', '.join(spec.choices)}, not {str(value)[:64]!r}")
    low, high = spec.at_least, spec.at_most
    if low is not None and high is not None and not low <= value <= high:
        problem = f"must be between {_number(low)} and {_number(high)}"
    elif low is not None and value < low:
        problem = "must not be negative" if low == 0 else f"must be at least {_number(low)}"
    elif high is not None and value > high:
        problem = f"must be at most {_number(high)}"
    elif spec.positive and value <= 0:
        problem = "must be positive"
    else:
        return
    raise SettingsError(f"{named} {problem}, not {_number(value)}")


def _in_units(name: str, value: float) -> str:
    """A default as people read it: 8388608 (8 MiB), 2592000 (30 days)."""
    shown = _number(value)
    if name.endswith("_bytes"):
        for size, unit in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
            if value >= size:
                return f"{shown} ({_number(value / size)} {unit})"
    if name.endswith("_s") and value >= 86400:
        return f"{shown} ({_number(value / 86400)} days)"
    return shown


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# --- what is derived for people and the warning ---

def env_names(cls: type) -> frozenset[str]:
    return frozenset(item.env for item in declared(cls) if item.env)


def markdown_rows(cls: type) -> Iterator[str]:
    """docs/configuration.md's table rows of ``cls``'s settings: flag, variable, file key, default, help."""
    for item in declared(cls):
        flags = " / ".join(f"`{f}`" for f in item.option_strings)
        key = "none" if item.name == CONFIG_KEY else f"`{item.name}`"
        cells = (flags, f"`{item.env}`" if item.env else "none", key, item.shown_default, item.described)
        yield "| " + " | ".join(cell.replace("|", "\\|").replace("<", "&lt;") for cell in cells) + " |"
