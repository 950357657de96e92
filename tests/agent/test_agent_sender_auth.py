"""The sender's token and TLS against real servers on 127.0.0.1: the Authorization header on every
POST, a refused token logged once (never the token), and https verified with --ca-file's CA
(certificates made here with the openssl command)."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.sender import Sender, ShardedSender
from hangwatch_common.cli_common import tls_context
from tests.agent.conftest import agent_argv
from tests.tls_certs import make_tls_files

TOKEN = "hw-test-token-7f3a"


class HeaderRecorder:
    """A monitor stand-in that keeps each POST's headers and answers ``status``; https when given
    a server SSL context."""

    def __init__(self, tls: ssl.SSLContext | None = None, status: int = 200):
        self.status = status
        self.requests: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["content-length"]))
                outer.requests.append({k.lower(): v for k, v in self.headers.items()} | {":path": self.path})
                body = json.dumps({"detail": "no"} if outer.status >= 400 else {}).encode()
                self.send_response(outer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def recorder():
    r = HeaderRecorder()
    try:
        yield r
    finally:
        r.close()


def test_every_post_carries_the_bearer_token(recorder):
    sender = Sender(recorder.url, token=lambda: TOKEN)
    try:
        assert sender.post({"a": 1}) and sender.post({"a": 2})
    finally:
        sender.client.close()
    assert [r["authorization"] for r in recorder.requests] == [f"Bearer {TOKEN}"] * 2
    assert recorder.requests[0][":path"] == "/api/v1/reports"


def test_no_token_no_header(recorder):
    sender = Sender(recorder.url)
    try:
        assert sender.post({"a": 1})
    finally:
        sender.client.close()
    assert "authorization" not in recorder.requests[0]


@pytest.mark.parametrize("status", [401, 403])
def test_refused_token_logged_once_counted_failed_never_logged(recorder, caplog, status):
    recorder.status = status
    sender = Sender(recorder.url, token=lambda: TOKEN)
    try:
        with caplog.at_level(logging.INFO, logger="agent.sender"):
            assert [sender.post({"a": i}) for i in range(3)] == [False] * 3
            assert sender.failed == 3 and sender.sent == 0
            recorder.status = 200
            assert sender.post({"a": 4}) and sender.sent == 1
            recorder.status = status
            assert sender.post({"a": 5}) is False
    finally:
        sender.client.close()
    refused = [r.getMessage() for r in caplog.records if "refused the token" in r.getMessage()]
    assert len(refused) == 2, caplog.text  # once per refusal spell, not per report
    assert f"HTTP {status}" in refused[0]
    assert any("takes the reports again" in r.getMessage() for r in caplog.records)
    assert "unreachable" not in caplog.text and TOKEN not in caplog.text


def test_refusal_without_a_token_says_to_give_one(recorder, caplog):
    recorder.status = 401
    sender = Sender(recorder.url)
    try:
        with caplog.at_level(logging.ERROR, logger="agent.sender"):
            assert sender.post({"a": 1}) is False
    finally:
        sender.client.close()
    assert "wants a token" in caplog.text and "--token-file" in caplog.text


def test_token_over_plain_http_to_another_host_is_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="agent.sender"):
        ShardedSender(["http://127.0.0.1:9", "http://10.255.255.1:9"], token=lambda: TOKEN).close()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "10.255.255.1" in warned[0] and TOKEN not in caplog.text


def test_agent_once_sends_the_token_from_its_file(recorder, tmp_path: Path):
    """The whole command line: --token-file -> the header the monitor sees."""
    token_file = tmp_path / "agent.token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    done = subprocess.run(
        agent_argv("--once", "--monitor", recorder.url, "--interval", "0.1", "--no-stacks", "--no-nccl-ras",
                   "--job", "no-such-job", "--token-file", str(token_file)),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [r["authorization"] for r in recorder.requests] == [f"Bearer {TOKEN}"]
    assert TOKEN not in done.stderr and TOKEN not in done.stdout


# --- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA and a server certificate for 127.0.0.1 signed by it."""
    return make_tls_files(tmp_path_factory.mktemp("pki")).ca_cert.parent


@pytest.fixture
def https_recorder(pki: Path):
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki / "server.pem", pki / "server.key")
    r = HeaderRecorder(tls)
    try:
        yield r
    finally:
        r.close()


def test_https_with_the_ca_file_posts(https_recorder, pki: Path):
    sender = Sender(https_recorder.url, token=lambda: TOKEN, verify=tls_context(str(pki / "ca.pem")))
    try:
        assert sender.post({"a": 1}) is True and sender.sent == 1
    finally:
        sender.client.close()
    assert https_recorder.requests[0]["authorization"] == f"Bearer {TOKEN}"


def test_https_without_the_ca_file_fails_logged_not_crashed(https_recorder, caplog):
    sender = Sender(https_recorder.url, token=lambda: TOKEN)
    try:
        with caplog.at_level(logging.WARNING, logger="agent.sender"):
            assert sender.post({"a": 1}) is False and sender.post({"a": 2}) is False
    finally:
        sender.client.close()
    assert sender.failed == 2 and sender.sent == 0 and https_recorder.requests == []
    (line,) = [r.getMessage() for r in caplog.records]  # once, not per report
    assert "CERTIFICATE_VERIFY_FAILED" in line and "--ca-file" in line and TOKEN not in line


def test_https_with_another_ca_fails(https_recorder, tmp_path: Path):
    """The CA file replaces the default bundle: only certificates it signed pass."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "k", "-out", "other.pem", "-days", "1", "-subj", "/CN=other"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    sender = Sender(https_recorder.url, verify=tls_context(str(tmp_path / "other.pem")))
    try:
        assert sender.post({"a": 1}) is False and sender.failed == 1
    finally:
        sender.client.close()


def test_agent_once_over_https_with_ca_file_from_env(https_recorder, pki: Path):
    env = {**os.environ, "HANGWATCH_CA_FILE": str(pki / "ca.pem")}
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "--once", "--monitor", https_recorder.url, "--interval", "0.1",
         "--no-stacks", "--no-nccl-ras", "--job", "no-such-job"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert len(https_recorder.requests) == 1
