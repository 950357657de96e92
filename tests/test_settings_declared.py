"""One declaration per setting (hangwatch_common/settings.py): for the monitor, the relay and the
agent alike, every setting has a flag, a HANGWATCH_* variable and an entry in --help with its
default; docs/configuration.md's tables and the warning's known names are what the declarations make; a value
comes from the flag, else the variable, else the default. (Spells unknown HANGWATCH_* names on
purpose: tests/monitor/test_env_names.py leaves it out of its scan.)"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.cli import build_parser as agent_parser, parse_config
from agent.settings import AgentSettings
from hangwatch_common.env_names import KNOWN, unknown_variables_warning
from hangwatch_common.settings import SettingsError, add_flags, declared, given, load, setting
from monitor.relay.cli import RelaySettings, build_parser as relay_parser, load_settings as relay_settings
from monitor.web.cli import build_parser as monitor_parser
from monitor.web.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DAEMONS = {"hangwatch-monitor": (Settings, monitor_parser), "hangwatch-relay": (RelaySettings, relay_parser),
           "hangwatch-agent": (AgentSettings, agent_parser)}
# Settings with no variable. The agent's monitor: HANGWATCH_MONITOR is the monitor the hangwatch
# command asks, and an agent run with --once in a shell that sets it must not post there.
NO_VARIABLE = {("hangwatch-agent", "monitor")}
ROWS = [(program, item.name) for program, (cls, _) in DAEMONS.items() for item in declared(cls)]


def help_entries(parser: argparse.ArgumentParser, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """First option -> its --help entry on one line."""
    monkeypatch.setenv("COLUMNS", "1000")
    entries = re.split(r"\n(?=  -)", parser.format_help())
    return {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries[1:]}


@pytest.mark.parametrize(("program", "name"), ROWS)
def test_every_setting_has_a_flag_a_variable_and_an_entry_in_help(program: str, name: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cls, build_parser = DAEMONS[program]
    (item,) = [item for item in declared(cls) if item.name == name]
    parser = build_parser()
    (action,) = [a for a in parser._actions if a.dest == name]
    assert set(item.flags) <= set(action.option_strings)
    assert item.flags[0] == "--" + name.removesuffix("_s").replace("_", "-")
    if (program, name) in NO_VARIABLE:
        assert item.env is None
    else:
        assert item.env == "HANGWATCH_" + name.upper() and item.env in KNOWN
    entry = help_entries(parser, monkeypatch)[item.flags[0]]
    assert item.spec.help in entry and f"(default: {item.shown_default}" in entry, entry
    assert (f"; env {item.env})" in entry) if item.env else "env HANGWATCH_" not in entry, entry


@pytest.mark.live
def test_each_installed_daemons_help_names_every_setting_and_its_variable() -> None:
    """The real programs, as a person runs them: every flag and HANGWATCH_* variable in --help."""
    wide = {**os.environ, "COLUMNS": "200"}
    helps = {program: subprocess.Popen([shutil.which(program) or str(Path(sys.executable).parent / program), "--help"],
                                       stdout=subprocess.PIPE, text=True, env=wide)
             for program in DAEMONS}  # all three at once: each is a second of imports
    for program, proc in helps.items():
        text, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, program
        cls, _ = DAEMONS[program]
        missing = [name for item in declared(cls) for name in (item.flags[0], item.env) if name and name not in text]
        assert not missing, (program, missing)
        assert "HANGWATCH_CONFIG" in text and "--log-format" in text and "--log-level" in text


def test_settings_in_several_daemons_mean_the_same_variable() -> None:
    """A variable shared by daemons (one environment file for all) is the same setting in each."""
    named = {}
    for program, (cls, _) in DAEMONS.items():
        for item in declared(cls):
            if item.env:
                named.setdefault(item.env, set()).add(item.name)
    assert all(len(names) == 1 for names in named.values()), named


def test_the_docs_tables_and_known_names_are_what_the_declarations_make() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "settings-docs.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for program, (cls, _) in DAEMONS.items():
        assert f"### `{program}`" in doc
        for item in declared(cls):
            assert f"| `{item.flags[0]}`" in doc


# --- where a value comes from ---

def monitor_port(argv: list[str], env: dict[str, str]) -> int:
    values, typed = given(monitor_parser().parse_args(argv))
    return Settings.load(values, env={"HANGWATCH_DB": "/tmp/m.db", **env}, option_names=typed).port


@pytest.mark.parametrize(("read", "variable", "flag", "default"), [
    (monitor_port, "HANGWATCH_PORT", "--port", 8787),
    (lambda argv, env: relay_settings(argv, env).port, "HANGWATCH_PORT", "--port", 8788),
    (lambda argv, env: parse_config(["--once", *argv], env)[0].interval, "HANGWATCH_INTERVAL", "--interval", 1.0),
], ids=["monitor", "relay", "agent"])
def test_the_flag_wins_over_the_variable_which_wins_over_the_default(read, variable, flag, default) -> None:
    assert read([], {}) == default
    assert read([], {variable: "9000"}) == 9000
    assert read([], {variable: ""}) == default  # an empty variable is unset
    assert read([flag, "9100"], {variable: "9000"}) == 9100


def test_an_error_names_the_spelling_that_gave_the_value(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    for argv, env, named in ((["--actions", missing], {}, "--actions"), (["--actions-file", missing], {}, "--actions-file"),
                             ([], {"HANGWATCH_ACTIONS_FILE": missing}, "HANGWATCH_ACTIONS_FILE")):
        values, typed = given(monitor_parser().parse_args(argv))
        with pytest.raises(SettingsError) as info:
            Settings.load(values, env={"HANGWATCH_DB": str(tmp_path / "m.db"), **env}, option_names=typed)
        assert str(info.value).startswith(f"{named}: "), info.value


# --- the mechanism, on a setting declared once ---

def _even(text: str) -> int:
    if int(text) % 2:
        raise ValueError("must be even")
    return int(text)


@dataclass(frozen=True)
class Toy:
    workers: int = setting(4, help="worker count", at_least=1, at_most=64)
    even: int = setting(2, parse=_even, help="an even number")
    fast: bool = setting(False, aliases=("-f",), help="go fast")
    tags: tuple[str, ...] = setting((), metavar="TAG", help="tags")
    cache: Path | None = setting(None, help="a cache file")
    wait_s: float = setting(1.5, help="seconds to wait", positive=True)
    level: str = setting("low", help="how high", choices=("low", "high"))


def toy(argv: list[str], env: dict[str, str] | None = None) -> Toy:
    parser = argparse.ArgumentParser()
    add_flags(parser, Toy)
    return load(Toy, parser.parse_args(argv), env or {})


def test_one_declaration_makes_the_flag_the_variable_and_the_checks() -> None:
    assert toy([]) == Toy()
    assert toy(["--workers", "8", "-f", "--tags", "a", "--tags", "b", "--cache", "~/c", "--wait", "2"]) == \
        Toy(workers=8, fast=True, tags=("a", "b"), cache=Path.home() / "c", wait_s=2.0)
    env = {"HANGWATCH_WORKERS": "16", "HANGWATCH_FAST": "yes", "HANGWATCH_TAGS": "x y", "HANGWATCH_LEVEL": "high"}
    assert toy([], env) == Toy(workers=16, fast=True, tags=("x", "y"), level="high")
    assert toy(["--no-fast", "--tags", "z"], env).fast is False and toy(["--tags", "z"], env).tags == ("z",)


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--workers", "0"], {}, "--workers must be between 1 and 64, not 0"),
    (["--workers", "lots"], {}, "--workers must be a whole number, not 'lots'"),
    ([], {"HANGWATCH_WORKERS": "65"}, "HANGWATCH_WORKERS must be between 1 and 64, not 65"),
    (["--even", "3"], {}, "--even must be even, not '3'"),
    (["--wait", "0"], {}, "--wait must be positive, not 0"),
    (["--wait", "nan"], {}, "--wait must be a number, not 'nan'"),
    ([], {"HANGWATCH_FAST": "maybe"}, "HANGWATCH_FAST must be one of 1, 0, true, false, yes, no, on, off, not 'maybe'"),
    (["--level", "mid"], {}, "--level must be one of low, high, not 'mid'"),
])
def test_a_bad_value_is_one_line_naming_where_it_came_from(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        toy(argv, env)
    assert str(info.value) == message


# --- the misspelling warning knows every declared variable ---

def test_no_declared_variable_is_taken_for_a_typo() -> None:
    names = {item.env for cls, _ in DAEMONS.values() for item in declared(cls) if item.env}
    assert unknown_variables_warning(dict.fromkeys(names, "1")) is None


@pytest.mark.parametrize(("typo", "meant"), [("HANGWATCH_NICEE", "HANGWATCH_NICE"),
                                             ("HANGWATCH_FLUSHMS", "HANGWATCH_FLUSH_MS"),
                                             ("HANGWATCH_STATEDIR", "HANGWATCH_STATE_DIR")])
def test_an_unknown_variable_is_still_named_with_the_declared_one_it_resembles(typo: str, meant: str) -> None:
    warning = unknown_variables_warning({typo: "1", "HANGWATCH_PORT": "1"})
    assert warning is not None and f"{typo} (did you mean {meant}?)" in warning and "HANGWATCH_PORT" not in warning
