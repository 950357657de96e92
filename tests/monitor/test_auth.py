"""Tokens: unit rules on text, then the real monitor refusing, accepting, binding nodes and rotating."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import EXE, metric, running_monitor

from monitor.web.auth import TokenFile, TokenFileError, parse_tokens, presented_token, request_kind
from tests.tls_certs import make_tls_files

SHARED = "shared-token-0123456789abcdef"
NODE_A = "node-a-token-0123456789abcdef"
NODE_B = "node-b-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
SCRAPER = "scraper-token-0123456789abcdef"
REPORTS = "/api/v1/reports"


# --- pure rules ---

@pytest.mark.parametrize(("text", "allow_nodes", "expected"), [
    (f"{SHARED}\n", True, {SHARED: None}),
    (f"# agents\n\n{SHARED}\nnode-a {NODE_A}\n", True, {SHARED: None, NODE_A: "node-a"}),
    (f"  {SHARED}  \r\n", False, {SHARED: None}),
])
def test_token_files_parse(text: str, allow_nodes: bool, expected: dict) -> None:
    assert parse_tokens(text, allow_nodes=allow_nodes, source="f").bound_to == expected


@pytest.mark.parametrize(("text", "allow_nodes", "needle"), [
    ("", True, "holds no token"),
    ("# only a comment\n", True, "holds no token"),
    (f"node-a {NODE_A}\n", False, "line 1: expected TOKEN"),
    (f"a b {NODE_A}\n", True, "expected TOKEN or NODE TOKEN"),
    ("short\n", True, "shorter than 16"),
])
def test_unusable_token_files_are_refused(text: str, allow_nodes: bool, needle: str) -> None:
    with pytest.raises(TokenFileError, match=needle):
        parse_tokens(text, allow_nodes=allow_nodes, source="f")


def _basic(password: str, user: str = "me") -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


@pytest.mark.parametrize(("headers", "expected"), [
    ([], None),
    ([(b"authorization", b"Bearer abc")], "abc"),
    ([(b"authorization", b"bearer   abc ")], "abc"),
    ([(b"authorization", _basic("tok"))], "tok"),
    ([(b"authorization", _basic("to:k"))], "to:k"),
    ([(b"authorization", b"Basic !!!")], None),
    ([(b"authorization", b"Digest abc")], None),
    ([(b"content-type", b"application/json")], None),
])
def test_the_presented_token_is_read_from_bearer_or_basic(headers: list, expected: str | None) -> None:
    assert presented_token(headers) == expected


@pytest.mark.parametrize(("path", "kind"), [
    ("/healthz", "open"), ("/api/v1/reports", "ingest"), ("/metrics", "metrics"),
    ("/diagnose", "read"), ("/", "read"), ("/api/v1/jobs/x/history", "read"), ("/static/app.js", "read"),
    ("/api/v1/jobs/x/timeline", "read"), ("/api/v1/jobs/x/evidence", "read"),
])
def test_requests_are_classed_by_path(path: str, kind: str) -> None:
    assert request_kind(path) == kind


def test_a_changed_token_file_is_reread_and_a_broken_edit_keeps_the_old_tokens(tmp_path: Path) -> None:
    now = [0.0]
    path = _token_file(tmp_path, "t", SHARED)
    tokens = TokenFile(path, allow_nodes=True, clock=lambda: now[0])
    path.write_text(f"{NODE_A}\n")
    os.utime(path, (1, 1))
    assert tokens.current().match(SHARED) == (True, None)  # not looked at again within a second
    now[0] = 2.0
    assert tokens.current().match(NODE_A) == (True, None) and tokens.current().match(SHARED)[0] is False
    path.write_text("")
    os.utime(path, (5, 5))
    now[0] = 4.0
    assert tokens.current().match(NODE_A)[0] is True


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = _token_file(tmp_path, "t", SHARED)
    path.chmod(0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        TokenFile(path, allow_nodes=True)


# --- the real monitor ---

def _token_file(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines))
    path.chmod(0o600)
    return path


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _jobs(base: str, headers: dict | None = None) -> list[str]:
    answer = httpx.get(f"{base}/diagnose", params={"format": "json"}, headers=headers or {}, timeout=5)
    assert answer.status_code == 200, answer.text
    return [j["job_id"] for j in answer.json()["jobs"]]


def test_reports_need_a_token_and_a_node_token_speaks_only_for_its_node(tmp_path: Path) -> None:
    tokens = _token_file(tmp_path, "agents.token", SHARED, f"node-a {NODE_A}")
    with running_monitor(tmp_path, "--token-file", str(tokens)) as monitor:
        url = monitor.base + REPORTS
        forged = report(node="node-b", ranks=[rank(job_id="forged", rank=1)])
        for headers in ({}, _bearer("not-the-token-at-all"), {"authorization": "Basic Zm9v"}):
            answer = httpx.post(url, json=forged, headers=headers, timeout=5)
            assert answer.status_code == 401, answer.text
            assert answer.json()["accepted"] is False and "bearer" in answer.headers["www-authenticate"].lower()
        assert _jobs(monitor.base) == []
        assert metric(monitor.base, "hangwatch_monitor_requests_unauthorized_total", kind="ingest") == 3
        assert metric(monitor.base, "hangwatch_reports_rejected_total", reason="unauthorized") == 3

        # node-a's token may not speak for node-b ...
        answer = httpx.post(url, json=forged, headers=_bearer(NODE_A), timeout=5)
        assert answer.status_code == 403 and "node-a" in answer.json()["detail"]
        assert _jobs(monitor.base) == []
        assert metric(monitor.base, "hangwatch_reports_rejected_total", reason="wrong_node") == 1
        # ... only for itself; the shared token for any node.
        own = report(node="node-a", ranks=[rank(job_id="job-a", rank=0)])
        assert httpx.post(url, json=own, headers=_bearer(NODE_A), timeout=5).status_code == 202
        assert httpx.post(url, json=forged, headers=_bearer(SHARED), timeout=5).status_code == 202
        assert sorted(_jobs(monitor.base)) == ["forged", "job-a"]
        log = monitor.log_text()
    assert SHARED not in log and NODE_A not in log and "not-the-token-at-all" not in log


def _job(base: str, job_id: str) -> dict:
    answer = httpx.get(f"{base}/diagnose", params={"format": "json", "job": job_id}, timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()["jobs"][0]


def test_a_node_token_cannot_claim_a_rank_another_node_runs(tmp_path: Path) -> None:
    """node-a's own token, node-a's own name, but a rank node-b runs: ignored and shown, until
    node-b says the rank ended (then the rank may move: an elastic restart)."""
    tokens = _token_file(tmp_path, "agents.token", f"node-a {NODE_A}", f"node-b {NODE_B}")
    with running_monitor(tmp_path, "--token-file", str(tokens)) as monitor:
        url = monitor.base + REPORTS
        held = [rank(job_id="job-x", rank=0, pid=2000), rank(job_id="job-x", rank=1, pid=2001, cpu_percent=1.0)]
        assert httpx.post(url, json=report(node="node-b", ranks=held), headers=_bearer(NODE_B),
                          timeout=5).status_code == 202
        claim = report(node="node-a", ranks=[rank(job_id="job-x", rank=1, pid=5001, cpu_percent=99.0)])
        answer = httpx.post(url, json=claim, headers=_bearer(NODE_A), timeout=5)
        assert answer.status_code == 202, answer.text  # the rest of node-a's report is its own
        job = _job(monitor.base, "job-x")
        assert {r["rank"]: r["node"] for r in job["ranks"]} == {0: "node-b", 1: "node-b"}, job["ranks"]
        assert [(c["rank"], c["claimed_by"], c["held_by"]) for c in job["rank_conflicts"]] == [(1, "node-a", "node-b")]
        assert metric(monitor.base, "hangwatch_monitor_rank_claims_refused_total") == 1
        text = httpx.get(f"{monitor.base}/diagnose", params={"job": "job-x"}, timeout=5).text
        assert "rank 1: claimed by node-a, run by node-b" in text, text

        ended = [held[0], {**held[1], "alive": False, "exit": {"at": time.time(), "code": -15, "source": "proc"}}]
        assert httpx.post(url, json=report(node="node-b", ranks=ended), headers=_bearer(NODE_B),
                          timeout=5).status_code == 202
        assert httpx.post(url, json={**claim, "sent_at": time.time()}, headers=_bearer(NODE_A),
                          timeout=5).status_code == 202
        job = _job(monitor.base, "job-x")
        assert {r["rank"]: r["node"] for r in job["ranks"]} == {0: "node-b", 1: "node-a"}, job["ranks"]
        assert job["rank_conflicts"] == []


def test_reads_and_metrics_can_each_require_their_own_token(tmp_path: Path) -> None:
    readers = _token_file(tmp_path, "read.token", READER)
    scrapers = _token_file(tmp_path, "metrics.token", SCRAPER)
    with running_monitor(tmp_path, "--read-token-file", str(readers), "--metrics-token-file", str(scrapers)) as monitor:
        base = monitor.base
        # Reports stay open here (no --token-file), so there is a job to read.
        assert httpx.post(base + REPORTS, json=report(ranks=[rank(job_id="job-r")]), timeout=5).status_code == 202
        read_paths = ("/diagnose", "/", "/api/v1/jobs/job-r/history", "/api/v1/jobs/job-r/timeline",
                      "/api/v1/jobs/job-r/evidence")
        for path in read_paths:
            refused = httpx.get(base + path, timeout=5)
            assert refused.status_code == 401, path
            # A browser asks for Basic credentials: the page's reader types the token as the password.
            assert refused.headers["www-authenticate"].startswith("Basic")
            assert "job-r" not in refused.text
            assert httpx.get(base + path, headers=_bearer(SCRAPER), timeout=5).status_code == 401
        assert _jobs(base, _bearer(READER)) == ["job-r"]
        assert httpx.get(base + "/", headers={"authorization": _basic(READER).decode()}, timeout=5).status_code == 200
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401
        assert httpx.get(base + "/metrics", headers=_bearer(READER), timeout=5).status_code == 401
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        scraper = _bearer(SCRAPER)
        assert metric(base, "hangwatch_monitor_requests_unauthorized_total", scraper, kind="read") == 2 * len(read_paths)
        assert metric(base, "hangwatch_monitor_requests_unauthorized_total", scraper, kind="metrics") == 2


def test_a_rotated_token_is_taken_without_a_restart(tmp_path: Path) -> None:
    tokens = _token_file(tmp_path, "agents.token", SHARED)
    with running_monitor(tmp_path, "--token-file", str(tokens)) as monitor:
        url, body = monitor.base + REPORTS, report(ranks=[rank(job_id="job-rot")])
        assert httpx.post(url, json=body, headers=_bearer(SHARED), timeout=5).status_code == 202
        rotated = "rotated-token-0123456789abcdef"
        tokens.write_text(f"{rotated}\n")
        deadline = time.monotonic() + 10
        while httpx.post(url, json=body, headers=_bearer(rotated), timeout=5).status_code != 202:
            assert time.monotonic() < deadline, "the rotated token was never accepted"
            time.sleep(0.2)
        assert httpx.post(url, json=body, headers=_bearer(SHARED), timeout=5).status_code == 401


@pytest.mark.parametrize(("mode", "content", "needle"), [
    (0o644, f"{SHARED}\n", "chmod 600"),
    (0o600, "", "holds no token"),
])
def test_the_monitor_will_not_start_with_an_unusable_token_file(tmp_path: Path, mode: int, content: str,
                                                               needle: str) -> None:
    path = tmp_path / "agents.token"
    path.write_text(content)
    path.chmod(mode)
    done = subprocess.run([EXE, "--port", "1", "--db", str(tmp_path / "m.db"), "--token-file", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert needle in done.stderr and SHARED not in done.stderr


def test_the_monitor_serves_https_with_its_certificate(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    trusted = ssl.create_default_context(cafile=str(tls.ca_cert))
    with running_monitor(tmp_path, "--ssl-certfile", str(tls.server_cert), "--ssl-keyfile", str(tls.server_key),
                         scheme="https", client_options={"verify": trusted}) as monitor:
        body = report(ranks=[rank(job_id="job-tls")])
        with httpx.Client(verify=trusted, timeout=5) as client:
            assert client.post(monitor.base + REPORTS, json=body).status_code == 202
            assert "job-tls" in client.get(monitor.base + "/diagnose").text
        with pytest.raises(httpx.ConnectError):
            httpx.get(monitor.base + "/healthz", timeout=5)  # no CA given: the certificate is not trusted
        with pytest.raises(httpx.TransportError):
            httpx.get(monitor.base.replace("https", "http") + "/healthz", timeout=5)


def _agent_once(monitor: str, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", "--once", "--monitor", monitor, "--node", node,
                           "--interval", "0.1", "--no-stacks", "--no-nccl-ras", "--job", "no-such-job", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_real_agent_reports_over_https_with_its_node_token(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    trusted = ssl.create_default_context(cafile=str(tls.ca_cert))
    tokens = _token_file(tmp_path, "agents.token", f"node-x {NODE_A}")
    agent_token = _token_file(tmp_path, "agent.token", NODE_A)
    wrong_token = _token_file(tmp_path, "wrong.token", SHARED)
    args = ("--token-file", str(tokens), "--ssl-certfile", str(tls.server_cert), "--ssl-keyfile", str(tls.server_key))
    with running_monitor(tmp_path, *args, scheme="https", client_options={"verify": trusted}) as monitor:
        ca = ("--ca-file", str(tls.ca_cert))
        done = _agent_once(monitor.base, "node-x", "--token-file", str(agent_token), *ca)
        assert done.returncode == 0, done.stderr
        assert _agent_once(monitor.base, "node-x", "--token-file", str(wrong_token), *ca).returncode == 1
        assert _agent_once(monitor.base, "node-y", "--token-file", str(agent_token), *ca).returncode == 1
        refused = _agent_once(monitor.base, "node-x", "--token-file", str(agent_token))  # no CA: not trusted
        assert refused.returncode == 1 and "--ca-file" in refused.stderr
        with httpx.Client(verify=trusted, timeout=5) as client:
            text = client.get(monitor.base + "/metrics").text
        assert 'hangwatch_agent_last_report_timestamp_seconds{node="node-x"}' in text and 'node="node-y"' not in text
        assert 'hangwatch_monitor_requests_unauthorized_total{kind="ingest"} 1.0' in text
        assert 'hangwatch_reports_rejected_total{reason="wrong_node"} 1.0' in text
        for done in (done, refused):
            assert NODE_A not in done.stderr + done.stdout


def test_ten_thousand_node_tokens_each_match_their_own_node_only() -> None:
    lines = "".join(f"node-{i:05d} tok-{i:05d}-0123456789abcdef\n" for i in range(10_000))
    tokens = parse_tokens(lines, allow_nodes=True, source="f")
    assert tokens.match("tok-04321-0123456789abcdef") == (True, "node-04321")
    assert tokens.match("tok-04321-0123456789abcdeF") == (False, None)
    assert tokens.match("") == (False, None)
