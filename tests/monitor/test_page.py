"""GET /: the status page is self-contained (works offline) and polls the JSON report."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from monitor_reports import frame, launcher, orphan, rank, report, stack
from monitor_testkit import FakeClock, TestClient

from monitor.diagnosis import Diagnosis
from monitor.routes.page import STATIC_DIR


def test_page_is_html_with_local_resources_only(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "<title>hangwatch</title>" in html
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert "/static/app.js" in refs and "/static/style.css" in refs
    assert not [r for r in refs if "//" in r]


def test_script_and_style_are_served_and_poll_the_json_report(client: TestClient) -> None:
    script = client.get("/static/app.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    assert "/diagnose?format=json" in script.text
    assert "2000" in script.text
    assert "innerHTML" not in script.text.replace("never innerHTML", "")
    assert not re.search(r"https?://", script.text)
    style = client.get("/static/style.css")
    assert style.status_code == 200
    assert not re.search(r"https?://|@import", style.text)


def test_script_parses() -> None:
    result = subprocess.run(["node", "--check", str(STATIC_DIR / "app.js")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def render_page(client: TestClient, tmp_path: Path) -> dict[str, object]:
    answer = tmp_path / "diagnose.json"
    answer.write_text(client.get("/diagnose", params={"format": "json"}).text)
    result = subprocess.run(
        ["node", str(Path(__file__).with_name("page_smoke.js")), str(STATIC_DIR / "app.js"), str(answer)],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_script_renders_jobs(client: TestClient, clock: FakeClock, tmp_path: Path) -> None:
    ranks = [rank(rank=0), rank(rank=1)]
    client.post("/api/v1/reports", json=report(ranks=ranks, sent_at=clock.now))
    shown = render_page(client, tmp_path)
    assert shown["status"].startswith("updated")
    assert "job-a" in shown["overview"]
    assert "job-a" in shown["jobs"] and "node-a" in shown["jobs"] and "1001" in shown["jobs"]
    assert shown["timers"] == 1  # the next poll is scheduled


def test_script_shows_stack_groups_launchers_and_orphans(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdict = {"word": "deadlock"}
    monkeypatch.setattr("monitor.diagnosis.diagnose", lambda job: Diagnosis(verdict["word"], (), None, "x"))
    odd = stack(clock.now, frames=[frame("barrier", "/x/site-packages/torch/distributed/distributed_c10d.py", 4100),
                                   frame("save_checkpoint", "/work/train.py", 150)])
    body = report(ranks=[rank(rank=0, stack=odd), rank(rank=1, stack=stack(clock.now))], sent_at=clock.now,
                  launchers=[launcher(worker_pids=[1000, 1001])], orphans=[orphan(4242, "torchrun stale.py", [29500])])
    client.post("/api/v1/reports", json=body)
    jobs = render_page(client, tmp_path)["jobs"]
    assert "save_checkpoint (train.py:150)" in jobs and "rank 0" in jobs and "rank 1" in jobs
    assert "node-a pid 900, node 0 of 2, 2 workers, alive" in jobs
    assert "node-a pid 4242 (listening on 29500): torchrun stale.py" in jobs
    verdict["word"] = "healthy"
    jobs = render_page(client, tmp_path)["jobs"]
    assert "save_checkpoint (train.py:150)" not in jobs  # stacks only for jobs in trouble
    assert "torchrun stale.py" in jobs
