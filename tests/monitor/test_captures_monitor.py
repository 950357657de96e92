"""Capture orders and uploads in a real monitor (uvicorn on loopback): the order reaches the nodes
of the incident's job once, a node uploads its own part only, gzipped, and the bundle lists it.
tests/e2e/test_actions.py runs the real agent on a real job."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import running_monitor

pytestmark = pytest.mark.live
NODE_A, NODE_B = "node-a-token-0123456789abcdef", "node-b-token-0123456789abcdef"


def _monitor_args(tmp_path: Path) -> list[str]:
    tokens = tmp_path / "agents.tokens"
    tokens.write_text(f"node-a {NODE_A}\nnode-b {NODE_B}\n")
    tokens.chmod(0o600)
    return ["--token-file", str(tokens), "--capture-after", "1", "--capture-dir", str(tmp_path / "caps")]


def _post(base: str, node: str, token: str, state: str) -> list[dict]:
    ranks = [rank(job_id="job-c", rank=0 if node == "node-a" else 1, pid=3000 if node == "node-a" else 3001,
                  state=state, cpu_percent=0.0)]
    answer = httpx.post(f"{base}/api/v1/reports", json=report(node=node, ranks=ranks, sent_at=time.time()),
                        headers={"authorization": f"Bearer {token}"}, timeout=5)
    assert answer.status_code == 202, answer.text
    return answer.json().get("orders", [])


def _upload(base: str, path: str, token: str, body: bytes, gzipped: bool = True) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    if gzipped:
        headers["content-encoding"] = "gzip"
    return httpx.post(base + path, content=body, headers=headers, timeout=10)


def test_each_node_of_the_job_is_asked_once_and_uploads_its_own_part(tmp_path: Path) -> None:
    with running_monitor(tmp_path, *_monitor_args(tmp_path)) as monitor:
        base = monitor.base
        orders: dict[str, list[dict]] = {"node-a": [], "node-b": []}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (orders["node-a"] and orders["node-b"]):
            orders["node-a"] += _post(base, "node-a", NODE_A, "T")  # rank 0 stopped: an incident
            orders["node-b"] += _post(base, "node-b", NODE_B, "S")
            time.sleep(0.3)
        [to_a], [to_b] = orders["node-a"], orders["node-b"]
        assert to_a["capture"]["pids"] == [3000] and to_b["capture"]["pids"] == [3001]
        assert to_a["capture"]["bundle"] == to_b["capture"]["bundle"]
        for _ in range(4):  # once per incident
            assert _post(base, "node-a", NODE_A, "T") == [] and _post(base, "node-b", NODE_B, "S") == []

        part = gzip.compress(b'{"ranks": []}')
        # node-a's token cannot upload node-b's part; a part must be gzipped; a bundle never asked is 404.
        assert _upload(base, to_b["capture"]["upload"], NODE_A, part).status_code == 403
        assert _upload(base, to_a["capture"]["upload"], NODE_A, b"{}", gzipped=False).status_code == 415
        assert _upload(base, "/api/v1/capture-uploads/nope/node-a", NODE_A, part).status_code == 404
        assert _upload(base, to_a["capture"]["upload"], "wrong-token-0123456789", part).status_code == 401
        assert _upload(base, to_a["capture"]["upload"], NODE_A, part).status_code == 201
        assert _upload(base, to_a["capture"]["upload"], NODE_A, part).status_code == 409  # once
        assert _upload(base, to_b["capture"]["upload"], NODE_B, part).status_code == 201
        [bundle] = httpx.get(f"{base}/api/v1/captures", params={"job": "job-c"}, timeout=5).json()["captures"]
        assert (bundle["verdict"], bundle["nodes_asked"], bundle["nodes_received"]) == ("rank_stopped", 2, 2)
        assert bundle["bytes"] == 2 * len(part)
        assert sorted(p.name for p in (tmp_path / "caps" / bundle["id"]).iterdir()) == \
            ["bundle.json", "node-a.json.gz", "node-b.json.gz"]
        assert httpx.get(f"{base}/api/v1/captures/no-such", timeout=5).status_code == 404
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
        assert "hangwatch_capture_requests_total 1" in metrics
        assert 'hangwatch_capture_parts_total{outcome="received"} 2' in metrics
        # Refused: the unknown bundle and node-a's second upload (403 and 415 never reach the store).
        assert 'hangwatch_capture_parts_total{outcome="refused"} 2' in metrics
        assert f"hangwatch_capture_bytes {2 * len(part)}" in metrics


def test_captures_can_be_turned_off(tmp_path: Path) -> None:
    with running_monitor(tmp_path, "--capture-after", "0") as monitor:
        assert httpx.get(f"{monitor.base}/api/v1/captures", timeout=5).json() == {"enabled": False, "captures": []}
        answer = httpx.post(f"{monitor.base}/api/v1/capture-uploads/b/n", content=gzip.compress(b"{}"),
                            headers={"content-encoding": "gzip"}, timeout=5)
        assert answer.status_code == 404
