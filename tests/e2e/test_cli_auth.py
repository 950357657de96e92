"""The ``hangwatch`` command against a monitor that wants a read token, and over https."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.monitor.monitor_reports import rank, report
from tests.monitor.real_monitor import running_monitor
from tests.tls_certs import make_tls_files

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

HANGWATCH = [sys.executable, "-m", "hangwatch.cli"]
READER = "reader-token-0123456789abcdef"
OTHER = "other-token-0123456789abcdef"
REPORTS = "/api/v1/reports"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # Neither variable from the caller's shell: each test says what the command gets.
    base = {k: v for k, v in os.environ.items() if k not in ("HANGWATCH_READ_TOKEN_FILE", "HANGWATCH_CA_FILE")}
    return subprocess.run([*HANGWATCH, *args], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})})


def _token_file(tmp_path: Path, name: str, token: str, mode: int = 0o600) -> Path:
    path = tmp_path / name
    path.write_text(f"{token}\n")
    path.chmod(mode)
    return path


def _shown(res: subprocess.CompletedProcess) -> str:
    return res.stdout + res.stderr


def _refused_one_line(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangwatch"), res.stderr
    assert all(n in lines[0] for n in needles), res.stderr
    assert "Traceback" not in res.stderr


def test_status_and_diagnose_with_the_read_token(tmp_path: Path) -> None:
    readers = tmp_path / "read.tokens"
    readers.write_text(f"# people\n{READER}\n")
    readers.chmod(0o600)
    mine = _token_file(tmp_path, "my.token", READER)
    wrong = _token_file(tmp_path, "wrong.token", OTHER)
    with running_monitor(tmp_path, "--read-token-file", str(readers)) as monitor:
        # Reports stay open here (no --token-file on the monitor), so there is a job to read.
        body = report(ranks=[rank(job_id="job-auth", rank=0), rank(job_id="job-auth", rank=1)])
        assert httpx.post(monitor.base + REPORTS, json=body, timeout=5).status_code == 202
        at = ("--monitor", monitor.base)

        runs = [
            run("status", *at, "--token-file", str(mine)),
            run("diagnose", *at, "--token-file", str(mine)),
            run("diagnose", *at, "--json", "--job", "job-auth", "--token-file", str(mine)),
            run("status", *at, env={"HANGWATCH_READ_TOKEN_FILE": str(mine)}),
        ]
        for res in runs:
            assert res.returncode in (0, 1), res  # the job's verdict decides which
            assert "job-auth" in res.stdout and res.stderr == "", res

        without = [run(cmd, *at) for cmd in ("status", "diagnose")]
        for res in without:
            _refused_one_line(res, monitor.base, "HTTP 401", "--token-file")
            assert "job-auth" not in res.stdout
        # An empty variable is as good as unset (an EnvironmentFile line left blank).
        _refused_one_line(run("status", *at, env={"HANGWATCH_READ_TOKEN_FILE": ""}), "--token-file")

        refused = run("status", *at, "--token-file", str(wrong))
        _refused_one_line(refused, "HTTP 401", str(wrong), "--token-file")

        open_to_others = _token_file(tmp_path, "open.token", READER, mode=0o644)
        _refused_one_line(run("status", *at, "--token-file", str(open_to_others)), "chmod 600")
        _refused_one_line(run("status", *at, "--token-file", str(tmp_path / "missing")), "cannot read token file")
        # A file named by a variable: the error names the variable, not an option never typed.
        for variable, path, problem in [("HANGWATCH_READ_TOKEN_FILE", tmp_path / "missing", "cannot read token file"),
                                        ("HANGWATCH_READ_TOKEN_FILE", open_to_others, "chmod 600"),
                                        ("HANGWATCH_CA_FILE", tmp_path / "missing.pem", "missing.pem")]:
            res = run("status", *at, env={variable: str(path)})
            _refused_one_line(res, f"hangwatch: error: {variable}", problem)
            assert "--token-file:" not in res.stderr and "--ca-file " not in res.stderr

        # Never taken on the command line, never echoed, never in the monitor's log.
        on_the_line = [run("status", *at, "--token", READER), run("status", *at, f"--token={READER}"),
                       run("status", *at, f"--tok={READER}")]
        for res in on_the_line:
            _refused_one_line(res)
        log = monitor.log_text()

    for res in (*runs, *without, refused, *on_the_line):
        assert READER not in _shown(res) and OTHER not in _shown(res)
    assert READER not in log and OTHER not in log


def test_status_over_https_with_the_ca_file(tmp_path: Path) -> None:
    import ssl

    tls = make_tls_files(tmp_path / "tls")
    trusted = ssl.create_default_context(cafile=str(tls.ca_cert))
    readers = _token_file(tmp_path, "read.tokens", READER)
    args = ("--read-token-file", str(readers), "--ssl-certfile", str(tls.server_cert),
            "--ssl-keyfile", str(tls.server_key))
    with running_monitor(tmp_path, *args, scheme="https", client_options={"verify": trusted}) as monitor:
        body = report(ranks=[rank(job_id="job-tls")])
        assert httpx.post(monitor.base + REPORTS, json=body, verify=trusted, timeout=5).status_code == 202
        at = ("--monitor", monitor.base, "--token-file", str(readers))

        res = run("status", *at, "--ca-file", str(tls.ca_cert))
        assert res.returncode in (0, 1) and "job-tls" in res.stdout, res
        res = run("diagnose", *at, env={"HANGWATCH_CA_FILE": str(tls.ca_cert)})
        assert res.returncode in (0, 1) and "job-tls" in res.stdout, res

        untrusted = run("status", *at)
        _refused_one_line(untrusted, "unreachable", "--ca-file")
        _refused_one_line(run("status", *at, "--ca-file", str(tmp_path / "missing.pem")), "--ca-file")
    assert READER not in _shown(untrusted)


@pytest.mark.parametrize("cmd", ["diagnose", "status"])
def test_a_monitor_without_read_tokens_needs_none(cmd: str, tmp_path: Path) -> None:
    """No read token configured anywhere: the commands work as before (the demo's monitor is such a one)."""
    with running_monitor(tmp_path) as monitor:
        res = run(cmd, "--monitor", monitor.base)
        assert res.returncode == 0 and res.stderr == "", res
