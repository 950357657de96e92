"""Settings: defaults, HANGWATCH_* variables, command-line overrides, checks at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.web.settings import Settings, SettingsError, default_db_path


def test_defaults_and_state_dir(tmp_path: Path) -> None:
    s = Settings.load(env={"HANGWATCH_STATE_DIR": str(tmp_path)})
    assert (s.host, s.port, s.db) == ("127.0.0.1", 8787, tmp_path / "monitor.db")
    assert s.max_body_bytes == 8 * 1024 * 1024


def test_default_db_path_order(tmp_path: Path) -> None:
    assert default_db_path({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "hangwatch" / "monitor.db"
    assert default_db_path({}) == Path.home() / ".local" / "state" / "hangwatch" / "monitor.db"


def test_env_then_overrides(tmp_path: Path) -> None:
    env = {"HANGWATCH_PORT": "9000", "HANGWATCH_HOST": "0.0.0.0", "HANGWATCH_DB": str(tmp_path / "x.db")}
    s = Settings.load({"port": "9100", "host": None}, env=env)
    assert (s.host, s.port, s.db) == ("0.0.0.0", 9100, tmp_path / "x.db")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"port": "http"}, "port must be a whole number, not 'http'"),
        ({"port": 0}, "port must be between 1 and 65535, not 0"),
        ({"port": 70000}, "port must be between 1 and 65535"),
        ({"job_retention_s": "nan"}, "job_retention_s must be a number, not 'nan'"),
        ({"log_level": "loud"}, "log_level must be one of critical, error, warning, info, debug, trace, not 'loud'"),
        ({"colour": "red"}, "unknown setting"),
    ],
)
def test_bad_values_fail_with_one_line(raw: dict, message: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_raw(raw)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_db_dir_is_created(tmp_path: Path) -> None:
    s = Settings.from_raw({"db": tmp_path / "a" / "b" / "m.db"})
    s.prepare_db_dir()
    assert (tmp_path / "a" / "b").is_dir()


def test_db_dir_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(SettingsError, match="cannot create database directory"):
        Settings.from_raw({"db": blocker / "sub" / "m.db"}).prepare_db_dir()


def test_db_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="is a directory"):
        Settings.from_raw({"db": tmp_path}).prepare_db_dir()


def test_a_directory_is_not_a_db(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="is a directory"):
        Settings.from_raw({"db": tmp_path}).prepare_db_dir()


def test_a_db_dir_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(SettingsError, match="cannot create database directory"):
        Settings.from_raw({"db": tmp_path / "file" / "m.db"}).prepare_db_dir()


# Each bad value given as a variable, then as the option: the message names what the person set.
NAMED_BAD_VALUES = [
    ("port", "0", "--port", "must be between 1 and 65535, not 0"),
    ("port", "99999", "--port", "must be between 1 and 65535, not 99999"),
    ("port", "http", "--port", "must be a whole number, not 'http'"),
    ("host", "", "--host", None),  # an empty variable is unset: no error from it
    ("job_retention_s", "-5", "--job-retention", "must be positive, not -5"),
    ("snapshot_interval_s", "0", "--snapshot-interval", "must be positive, not 0"),
    ("verdict_retention_s", "soon", "--verdict-retention", "must be a number, not 'soon'"),
    ("max_body_bytes", "10", "--max-body-bytes", "must be at least 1024, not 10"),
    ("max_connections", "0", "--max-connections", "must be at least 1, not 0"),
    ("log_level", "loud", "--log-level", "must be one of critical, error, warning, info, debug, trace"),
    ("ssl_certfile", "/nonexistent/cert.pem", "--ssl-certfile", "go together"),
    ("confirm_alarms", "perhaps", None, "must be one of 1, 0, true, false, yes, no, on, off, not 'perhaps'"),
    ("tick_interval_s", "-1", None, "must not be negative, not -1"),
    ("straggler_window_s", "3", "--straggler-window", "must be at least 6 s (levels are medians of one report a "
     "second), not 3"),
]


@pytest.mark.parametrize(("setting", "value", "option", "problem"), NAMED_BAD_VALUES)
def test_errors_name_the_variable_or_option_that_set_the_value(
    tmp_path: Path, setting: str, value: str, option: str | None, problem: str | None
) -> None:
    from hangwatch_common.settings import declared

    variable = "HANGWATCH_" + setting.upper()
    env = {"HANGWATCH_STATE_DIR": str(tmp_path), variable: value}
    if problem is None:
        Settings.load(env=env)
        return
    with pytest.raises(SettingsError) as from_env:
        Settings.load(env=env)
    assert str(from_env.value).startswith(f"{variable} ") and problem in str(from_env.value), from_env.value
    if option is None:
        return
    names = {item.name: item.flags[0] for item in declared(Settings)}
    assert names[setting] == option
    with pytest.raises(SettingsError) as from_option:
        Settings.load({setting: value}, env={"HANGWATCH_STATE_DIR": str(tmp_path)}, option_names=names)
    assert str(from_option.value).startswith(f"{option} ") and problem in str(from_option.value), from_option.value


def test_the_option_wins_over_the_variable_and_is_the_one_named(tmp_path: Path) -> None:
    env = {"HANGWATCH_STATE_DIR": str(tmp_path), "HANGWATCH_PORT": "8080"}
    with pytest.raises(SettingsError, match=r"^--port must be between 1 and 65535, not 0$"):
        Settings.load({"port": "0"}, env=env, option_names={"port": "--port"})
