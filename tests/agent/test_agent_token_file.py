"""The agent's token file (hangwatch_common/token_file.py): the rules table-style, rotation, and the command
line's start-up errors (exit 2, one line, never the token)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agent.cli import main, parse_config
from hangwatch_common.token_file import RELOAD_CHECK_S, TokenFileError, TokenSource, read_token, token_from


@pytest.mark.parametrize(
    "text, mode, token",
    [
        ("abc123\n", 0o100600, "abc123"),
        ("  abc123  \n\n", 0o100400, "abc123"),
        ("hw_8f3a-Zz.~+/=\n", 0o100600, "hw_8f3a-Zz.~+/="),
    ],
)
def test_token_from_good(text, mode, token):
    assert token_from(text, mode, "/etc/hangwatch/agent.token") == token


@pytest.mark.parametrize(
    "text, mode, message",
    [
        ("abc\n", 0o100644, "open to group or others (mode 0644): chmod 600 /t"),
        ("abc\n", 0o100640, "mode 0640"),
        ("abc\n", 0o100620, "mode 0620"),  # writable by the group: anyone there could swap it
        ("abc\n", 0o100604, "mode 0604"),
        ("", 0o100600, "is empty"),
        (" \n\n", 0o100600, "is empty"),
        ("abc\ndef\n", 0o100600, "must hold one token"),
        ("abc def", 0o100600, "must hold one token"),
        ("tök", 0o100600, "must hold one token"),
        ("a\x07b", 0o100600, "must hold one token"),
    ],
)
def test_token_from_refused(text, mode, message):
    with pytest.raises(TokenFileError) as e:
        token_from(text, mode, "/t")
    assert message in str(e.value) and "\n" not in str(e.value)
    if text.strip():
        assert text.strip() not in str(e.value)  # the token is never in a message


@pytest.fixture(autouse=True)
def _logging_restored():
    """main() sets up the process's logging (a stderr handler on the root logger, bound to this
    test's captured stderr); the worker's next tests get the logging they had."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _token_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_read_token_follows_a_symlink_like_a_kubernetes_secret(tmp_path: Path):
    data = tmp_path / "..data"
    data.mkdir()
    _token_file(data / "token", "s3cret\n", 0o400)
    (tmp_path / "token").symlink_to("..data/token")
    assert read_token(str(tmp_path / "token"))[0] == "s3cret"


def test_read_token_missing_and_binary(tmp_path: Path):
    with pytest.raises(TokenFileError, match="cannot read token file .*: No such file"):
        read_token(str(tmp_path / "nope"))
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    os.chmod(tmp_path / "bin", 0o600)
    with pytest.raises(TokenFileError, match="printable ASCII"):
        read_token(str(tmp_path / "bin"))


def test_rotation_picks_up_a_new_token_and_keeps_the_last_good_one(tmp_path: Path, caplog):
    path = _token_file(tmp_path / "agent.token", "first\n")
    now = [0.0]
    source = TokenSource(str(path), clock=lambda: now[0])
    assert source.current() == "first"

    # Rotated the usual way: a new file renamed over the old one.
    _token_file(tmp_path / "new", "second-token\n")
    os.replace(tmp_path / "new", path)
    assert source.current() == "first"  # not checked again before RELOAD_CHECK_S
    now[0] += RELOAD_CHECK_S
    assert source.current() == "second-token"

    # A botched edit: world-readable, then empty. The last good token stays, each problem logged once.
    with caplog.at_level(logging.WARNING, logger="hangwatch_common.token_file"):
        os.chmod(path, 0o644)
        for _ in range(3):
            now[0] += RELOAD_CHECK_S
            assert source.current() == "second-token"
        _token_file(path, "", 0o600)
        now[0] += RELOAD_CHECK_S
        assert source.current() == "second-token"
        path.unlink()
        now[0] += RELOAD_CHECK_S
        assert source.current() == "second-token"
    problems = [r.getMessage() for r in caplog.records]
    assert len(problems) == 3, problems
    assert "chmod 600" in problems[0] and "is empty" in problems[1] and "No such file" in problems[2]
    assert not any("second-token" in p for p in problems)

    _token_file(path, "third\n")
    now[0] += RELOAD_CHECK_S
    assert source.current() == "third"


def test_token_file_from_the_environment(tmp_path: Path):
    path = str(_token_file(tmp_path / "t", "x\n"))
    assert parse_config(["--once"], environ={"HANGWATCH_TOKEN_FILE": path})[0].token_file == path
    given = parse_config(["--once", "--token-file", "/other"], environ={"HANGWATCH_TOKEN_FILE": path})[0]
    assert given.token_file == "/other"
    assert parse_config(["--once"], environ={"HANGWATCH_TOKEN_FILE": ""})[0].token_file is None
    assert parse_config(["--once"], environ={"HANGWATCH_CA_FILE": "/ca.pem"})[0].ca_file == "/ca.pem"


MONITOR = ["--monitor", "http://127.0.0.1:9"]


@pytest.mark.parametrize(
    "text, mode, message",
    [
        ("tok-abc\n", 0o644, "chmod 600"),
        ("", 0o600, "is empty"),
        (None, 0o600, "cannot read token file"),
    ],
)
def test_bad_token_file_exits_2_with_one_line(tmp_path: Path, capsys, monkeypatch, text, mode, message):
    path = tmp_path / "agent.token"
    if text is not None:
        _token_file(path, text, mode)
    for args, environ in ((["--token-file", str(path)], {}), ([], {"HANGWATCH_TOKEN_FILE": str(path)})):
        for key, value in environ.items():
            monkeypatch.setenv(key, value)
        assert main([*MONITOR, *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hangwatch-agent: error: ") and message in lines[0], lines
        assert "tok-abc" not in lines[0]


@pytest.mark.parametrize("args", [["--token", "tok-abc"], ["--token=tok-abc"], ["--token"]])
def test_token_on_the_command_line_is_refused_without_echo(capsys, args):
    assert main([*MONITOR, *args]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "tok-abc" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content, message",
    [(None, "No such file"), ("not a certificate\n", "--ca-file")],
)
def test_bad_ca_file_exits_2(tmp_path: Path, capsys, content, message):
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_text(content)
    assert main(["--monitor", "https://127.0.0.1:9", "--ca-file", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
