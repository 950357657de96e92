"""The actions file (monitor/engine/actions/config.py): what it accepts, and one clear line for what it does not."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from monitor.engine.actions.config import ActionConfigError, load_actions, parse_actions
from monitor.web.settings import Settings, SettingsError

GOOD = """
dry_run = false
max_actions = 3
per_seconds = 600
[[rule]]
name = "cancel"
verdicts = ["deadlock", "stalled"]
after_s = 300
command = ["scancel", "{slurm_job}"]
[[rule]]
name = "chat"
verdicts = ["deadlock"]
after_s = 60
webhook = "https://chat.example/hook"
[[rule]]
name = "restart"
verdicts = ["rank_stopped"]
after_s = 0
signal = "SIGABRT"
"""


def test_a_good_file() -> None:
    config = parse_actions(tomllib.loads(GOOD))
    assert not config.dry_run and config.max_actions == 3 and config.per_seconds == 600
    assert [(r.name, r.kind) for r in config.rules] == [("cancel", "command"), ("chat", "webhook"),
                                                        ("restart", "signal")]
    assert config.rules[0].command == ("scancel", "{slurm_job}")
    assert config.verdicts == {"deadlock", "stalled", "rank_stopped"}


def test_dry_run_unless_the_file_says_otherwise() -> None:
    config = parse_actions(tomllib.loads('[[rule]]\nname="x"\nverdicts=["deadlock"]\nafter_s=1\nsignal="SIGTERM"\n'))
    assert config.dry_run and not config.trust_unbound_nodes


RULE = 'name = "x"\nverdicts = ["deadlock"]\nafter_s = 5\n'


@pytest.mark.parametrize(("text", "needle"), [
    ("dry_run = false\n", "no [[rule]]"),
    (f"[[rule]]\n{RULE}", "exactly one of command, webhook, signal"),
    (f'[[rule]]\n{RULE}command = ["a"]\nsignal = "SIGTERM"\n', "exactly one of"),
    ('[[rule]]\nname = "x"\nverdicts = ["healthy"]\nafter_s = 5\nsignal = "SIGTERM"\n', "cannot act on ['healthy']"),
    ('[[rule]]\nname = "x"\nverdicts = ["unknown"]\nafter_s = 5\nsignal = "SIGTERM"\n', "cannot act on ['unknown']"),
    (f'[[rule]]\n{RULE}signal = "SIGKILL"\n', "signal must be one of"),
    (f'[[rule]]\n{RULE}command = "scancel 1"\n', "list of arguments (no shell)"),
    (f'[[rule]]\n{RULE}command = ["scancel", "{{slurm_id}}"]\n', "unknown placeholder {slurm_id}"),
    (f'[[rule]]\n{RULE}webhook = "file:///etc/passwd"\n', "webhook must be an http(s) URL"),
    ('[[rule]]\nname = "x"\nverdicts = ["deadlock"]\nsignal = "SIGTERM"\n', "after_s is required"),
    ('[[rule]]\nname = "x"\nverdicts = ["deadlock"]\nafter_s = -1\nsignal = "SIGTERM"\n', "must not be negative"),
    (f'[[rule]]\n{RULE}signal = "SIGTERM"\n[[rule]]\n{RULE}signal = "SIGINT"\n', "rule names repeat"),
    (f'max_actions = 0\n[[rule]]\n{RULE}signal = "SIGTERM"\n', "max_actions must be at least 1"),
    (f'dry_run = "no"\n[[rule]]\n{RULE}signal = "SIGTERM"\n', "dry_run must be true or false"),
    (f'dryrun = false\n[[rule]]\n{RULE}signal = "SIGTERM"\n', "unknown key 'dryrun'"),
    ('[[rule]]\nname = "a b"\nverdicts = ["deadlock"]\nafter_s = 1\nsignal = "SIGTERM"\n', "name must be"),
])
def test_what_cannot_work_is_refused_with_one_line(text: str, needle: str) -> None:
    with pytest.raises(ActionConfigError) as refused:
        parse_actions(tomllib.loads(text))
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_the_monitor_refuses_to_start_on_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "actions.toml"
    bad.write_text("[[rule]\n")
    with pytest.raises(ActionConfigError, match="not TOML"):
        load_actions(bad)
    with pytest.raises(SettingsError, match=r"^--actions: actions file .*not TOML"):
        Settings.load({"actions_file": str(bad), "db": str(tmp_path / "m.db")}, env={},
                      option_names={"actions_file": "--actions"})
    with pytest.raises(SettingsError, match="No such file"):
        Settings.load({"actions_file": str(tmp_path / "missing.toml"), "db": str(tmp_path / "m.db")}, env={})
