"""Settings: defaults, HANGWATCH_* variables, command-line overrides, checks at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.settings import Settings, SettingsError, default_db_path


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
        ({"port": "http"}, "port: 'http' is not a valid int"),
        ({"port": 0}, "port must be between 1 and 65535"),
        ({"port": 70000}, "port must be between 1 and 65535"),
        ({"job_retention_s": "nan"}, "job_retention_s"),
        ({"log_level": "loud"}, "unknown log level"),
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
