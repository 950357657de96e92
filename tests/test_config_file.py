"""The daemons' TOML config file (hangwatch_common/config_file.py): the settings' names as keys, below
the flag and the variable and above the default; each value through the same checks; a key, value or
file that cannot work stops the daemon at start with one line (exit 2) naming the file and the key.
(Spells unknown names on purpose: tests/monitor/test_env_names.py leaves it out of its scan.)"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from agent import cli as agent_cli
from agent.settings import AgentSettings
from hangwatch_common.settings import DaemonSettings, SettingsError, build, gather, setting
from monitor.relay import cli as relay_cli
from monitor.relay.cli import RelaySettings
from monitor.web import cli as monitor_cli
from monitor.web.settings import Settings
from tests.monitor.real_monitor import EXE

ROOT = Path(__file__).resolve().parents[1]
DAEMONS = {"monitor": Settings, "relay": RelaySettings, "agent": AgentSettings}


@dataclass(frozen=True)
class Toy(DaemonSettings):
    config_table: ClassVar[str] = "monitor"
    workers: int = setting(4, help="worker count", at_least=1, at_most=64)
    tags: tuple[str, ...] = setting((), help="tags")
    wait_s: float = setting(1.5, help="seconds to wait", positive=True)
    fast: bool = setting(False, help="go fast")


def toy(config: Path | None, flags: dict[str, str] | None = None, env: dict[str, str] | None = None) -> Toy:
    values = {"config": str(config) if config else None, **(flags or {})}
    return build(Toy, *gather(Toy, values, env or {}, {name: f"--{name}" for name in values}))


def written(tmp_path: Path, text: str, name: str = "hangwatch.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- where a value comes from: flag, else variable, else file, else default ---

@pytest.mark.parametrize(("flag", "variable", "in_file", "expected"), [
    (None, None, None, 4),
    (None, None, "10", 10),
    (None, "20", "10", 20),
    ("30", "20", "10", 30),
    ("30", None, "10", 30),
    ("30", "20", None, 30),
    (None, "20", None, 20),
    (None, "", "10", 10),  # an empty variable is unset: the file's value stands
])
def test_the_flag_wins_over_the_variable_which_wins_over_the_file_which_wins_over_the_default(
        tmp_path: Path, flag: str | None, variable: str | None, in_file: str | None, expected: int) -> None:
    config = written(tmp_path, f"workers = {in_file}\n" if in_file else "")
    env = {"HANGWATCH_WORKERS": variable} if variable is not None else {}
    assert toy(config, {"workers": flag}, env).workers == expected


@pytest.mark.parametrize("program", DAEMONS)
def test_each_daemon_takes_its_port_or_interval_from_the_file(tmp_path: Path, program: str) -> None:
    cls = DAEMONS[program]
    name, value = ("interval", 0.25) if program == "agent" else ("port", 9123)
    config = written(tmp_path, f"{name} = {value}\nlog_format = 'json'\n")
    settings = build(cls, *gather(cls, {}, {"HANGWATCH_CONFIG": str(config)}))
    assert (getattr(settings, name), settings.log_format, settings.config) == (value, "json", config)


def test_the_variable_names_the_file_too(tmp_path: Path) -> None:
    config = written(tmp_path, "workers = 7\n")
    assert toy(None, env={"HANGWATCH_CONFIG": str(config)}).workers == 7
    assert toy(None, env={"HANGWATCH_CONFIG": str(tmp_path / "other.toml")},
               flags={"config": str(config)}).workers == 7  # the flag's file, not the variable's


def test_a_daemons_table_wins_over_the_top_level_and_the_other_tables_are_theirs(tmp_path: Path) -> None:
    config = written(tmp_path, "workers = 2\nfast = true\n[monitor]\nworkers = 3\n[agent]\nnot_a_toy_setting = 1\n"
                               "[relay]\nworkers = 'not a number, and no concern of the monitor'\n")
    assert (toy(config).workers, toy(config).fast) == (3, True)


def test_one_file_serves_all_three_daemons(tmp_path: Path) -> None:
    config = written(tmp_path, 'log_format = "json"\n[monitor]\nmax_jobs = 500\n[relay]\n'
                               'monitor = "http://127.0.0.1:8787"\nport = 8788\n[agent]\n'
                               'monitor = ["http://127.0.0.1:8788", "http://127.0.0.1:8789"]\n')
    env = {"HANGWATCH_CONFIG": str(config)}
    monitor, relay, agent = (build(cls, *gather(cls, {}, env)) for cls in DAEMONS.values())
    assert (monitor.max_jobs, monitor.port, monitor.log_format) == (500, 8787, "json")
    assert (relay.monitor, relay.port, relay.log_format) == ("http://127.0.0.1:8787", 8788, "json")
    assert agent.monitor == ("http://127.0.0.1:8788", "http://127.0.0.1:8789") and agent.log_format == "json"


def test_values_go_through_the_same_conversion_as_a_flags(tmp_path: Path) -> None:
    config = written(tmp_path, 'tags = ["a b", "c"]\nwait_s = 2\nfast = "yes"\n')
    assert toy(config) == Toy(config=config, tags=("a b", "c"), wait_s=2.0, fast=True)  # no splitting of "a b"
    assert toy(written(tmp_path, 'tags = "one"\n')).tags == ("one",)  # one value alone
    agent = build(AgentSettings, *gather(AgentSettings, {}, {"HANGWATCH_CONFIG": str(written(
        tmp_path, "max_rss_mb = 0\nnice = 5\njob = [12345]\n"))}))
    assert (agent.max_rss_mb, agent.nice, agent.job) == (None, 5, ("12345",))  # 0: no cap, as from the flag


# --- what cannot work: one line naming the file and the key ---

@pytest.mark.parametrize(("text", "message"), [
    ("workers = 0\n", "{file}: workers must be between 1 and 64, not 0"),
    ("workers = 2.5\n", "{file}: workers must be a whole number, not '2.5'"),
    ("wait_s = nan\n", "{file}: wait_s must be a number, not 'nan'"),
    ("fast = 2\n", "{file}: fast must be one of 1, 0, true, false, yes, no, on, off, not '2'"),
    ("[monitor]\nworkers = 65\n", "{file}: monitor.workers must be between 1 and 64, not 65"),
    ("worker = 8\n", "{file}: worker: hangwatch-monitor has no such setting (did you mean workers?)"),
    ("wait = 8\n", "{file}: wait: hangwatch-monitor has no such setting (did you mean wait_s?)"),
    ("log-format = 'json'\n", "{file}: log-format: hangwatch-monitor has no such setting (did you mean log_format?)"),
    ("colour = 'red'\n", "{file}: colour: hangwatch-monitor has no such setting"),
    ("[montor]\nworkers = 8\n", "{file}: montor: hangwatch-monitor has no such setting"),
    ("workers = [1, 2]\n", "{file}: workers takes one value, not an array"),
    ("workers = {a = 1}\n", "{file}: workers must be a string, a number, true or false (or an array of them), "
                            "not a table"),
    ("tags = [[1]]\n", "{file}: tags must be a string, a number, true or false (or an array of them), not an array"),
    ("when = 1979-05-27\n", "{file}: when: hangwatch-monitor has no such setting"),
    ("config = 'other.toml'\n", "{file}: config: a config file cannot name another (give --config or "
                                "HANGWATCH_CONFIG)"),
    ("workers = \n", "--config {file}: not TOML: Invalid value (at line 1, column 11)"),
    ("workers = 1\nworkers = 2\n", "--config {file}: not TOML: Cannot overwrite a value (at line 2, column 12)"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    config = written(tmp_path, text)
    with pytest.raises(SettingsError) as info:
        toy(config)
    assert str(info.value) == message.format(file=config)


def test_a_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    for path, problem in ((tmp_path / "missing.toml", "No such file or directory"), (tmp_path, "Is a directory"),
                          (written(tmp_path, "").with_name("latin1.toml"), "not TOML: not UTF-8 text")):
        if path.name == "latin1.toml":
            path.write_bytes(b"name = '\xe9'\n")
        with pytest.raises(SettingsError) as info:
            toy(None, env={"HANGWATCH_CONFIG": str(path)})
        assert str(info.value) == f"HANGWATCH_CONFIG {path}: {problem}"


@pytest.mark.parametrize(("main", "program"), [(monitor_cli.main, "hangwatch-monitor"),
                                               (relay_cli.main, "hangwatch-relay"),
                                               (agent_cli.main, "hangwatch-agent")])
@pytest.mark.parametrize(("text", "problem"), [("log_level = 'loud'\n", "log_level must be one of"),
                                               ("prot = 8787\n", "has no such setting"),
                                               ("port = \n", "not TOML")])
def test_each_daemon_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], main, program: str,
                                           text: str, problem: str) -> None:
    config = written(tmp_path, text)
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{program}: error: ") and str(config) in err, err
    assert problem in err, err


@pytest.mark.live
def test_the_installed_monitor_exits_2_with_one_line(tmp_path: Path) -> None:
    config = written(tmp_path, "max_job = 10\n")
    done = subprocess.run([EXE, "--config", str(config)], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"hangwatch-monitor: error: {config}: max_job: hangwatch-monitor has no such setting " \
                          "(did you mean max_jobs?)\n"


# --- the documented examples are files the daemons take ---

def doc_examples() -> list[tuple[str, str]]:
    """(the file's name, its text) of each TOML example in docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    blocks = re.findall(r"^```toml\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return [(re.match(r"# \S*/(\S+\.toml):", block).group(1), block) for block in blocks]


def test_every_example_in_the_docs_is_a_file_its_daemons_take(tmp_path: Path) -> None:
    examples = doc_examples()
    assert {name for name, _ in examples} == {"monitor.toml", "relay.toml", "agent.toml", "hangwatch.toml"}
    for name, text in examples:
        config = written(tmp_path, text, name)
        readers = DAEMONS if name == "hangwatch.toml" else [name.removesuffix(".toml")]
        for program in readers:
            cls = DAEMONS[program]
            raw, sources = gather(cls, {}, {"HANGWATCH_CONFIG": str(config)})
            assert len(raw) > 2, (name, program, raw)  # more than the file and the format
            build(cls, raw, sources)
