"""GET /: the status page is self-contained (works offline) and polls the JSON report."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from monitor_reports import frame, launcher, orphan, progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient

from monitor.diagnosis import Diagnosis
from monitor.routes.page import STATIC_DIR

SVG_NS = "http://www.w3.org/2000/svg"


def test_page_is_html_with_local_resources_only(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "<title>hangwatch</title>" in html
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert "/static/app.js" in refs and "/static/style.css" in refs
    assert not [r for r in refs if "//" in r]
    # An empty data: icon, so the browser asks for no /favicon.ico.
    assert '<link rel="icon" href="data:,">' in html


def test_script_and_style_are_served_and_poll_the_json_report(client: TestClient) -> None:
    script = client.get("/static/app.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    assert "/diagnose?format=json" in script.text
    assert "2000" in script.text
    assert "innerHTML" not in script.text.replace("never innerHTML", "")
    # The SVG namespace name is the one address allowed: it is never fetched.
    assert script.text.count(SVG_NS) == 1
    assert not re.search(r"https?://", script.text.replace(SVG_NS, ""))
    style = client.get("/static/style.css")
    assert style.status_code == 200
    assert not re.search(r"https?://|@import", style.text)


def test_script_parses() -> None:
    result = subprocess.run(["node", "--check", str(STATIC_DIR / "app.js")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def render_page(client: TestClient, tmp_path: Path) -> dict[str, Any]:
    """What app.js shows for the monitor's current answer; each job's history comes from the monitor too."""
    answer = tmp_path / "diagnose.json"
    data = client.get("/diagnose", params={"format": "json"}).json()
    answer.write_text(json.dumps(data))
    routes = {}
    for job in data["jobs"]:
        url = f"/api/v1/jobs/{job['job_id']}/history"
        routes[url] = client.get(url).json()
    routes_file = tmp_path / "routes.json"
    routes_file.write_text(json.dumps(routes))
    result = subprocess.run(
        ["node", str(Path(__file__).with_name("page_smoke.js")), str(STATIC_DIR / "app.js"), str(answer),
         str(routes_file)],
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


def test_chart_draws_one_line_per_rank_and_marks_since_when_in_trouble(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdict = {"word": "healthy"}
    monkeypatch.setattr("monitor.diagnosis.diagnose",
                        lambda job: Diagnosis(verdict["word"], (1,), job.now - 20, f"{verdict['word']} now"))
    now = clock.now
    ranks = [rank(rank=r, progress=progress(3, 30 + r, [(now - 90, 10 + r), (now - 60, 20 + r), (now - 30, 30 + r)]))
             for r in range(3)]
    client.post("/api/v1/reports", json=report(ranks=ranks, sent_at=now))
    card = render_page(client, tmp_path)["cards"]["job-a"]
    assert card["charts"] == 1 and card["svg_namespace"] == [SVG_NS]
    assert sorted(p["ranks"] for p in card["paths"]) == ["0", "1", "2"]
    assert len({p["stroke"] for p in card["paths"]}) == 3
    for path in card["paths"]:
        # Three points and a flat run to now: the line of a live rank.
        assert re.fullmatch(r"M[\d.]+,[\d.]+( L[\d.]+,[\d.]+){3}", path["d"]), path["d"]
    assert card["since_markers"] == 0  # healthy: no marker
    assert "rank 0 (step 30)" in card["legend"] and "rank 2 (step 32)" in card["legend"]

    verdict["word"] = "deadlock"
    clock.advance(5)
    card = render_page(client, tmp_path)["cards"]["job-a"]
    assert card["since_markers"] == 1
    assert "deadlock since" in card["chart_text"]


def test_ranks_sharing_a_job_log_share_one_line_and_no_steps_says_so(client: TestClient, clock: FakeClock,
                                                                    tmp_path: Path) -> None:
    shared = progress(2, 8, [(clock.now - 10, 7), (clock.now - 5, 8)], scope="job")
    body = report(ranks=[rank(job_id="shared", rank=r, progress=shared) for r in range(4)], sent_at=clock.now)
    client.post("/api/v1/reports", json=body)
    client.post("/api/v1/reports", json=report(node="node-b", ranks=[rank(job_id="quiet")], sent_at=clock.now))
    cards = render_page(client, tmp_path)["cards"]
    assert [p["ranks"] for p in cards["shared"]["paths"]] == ["0,1,2,3"]
    assert "ranks 0-3 (step 8)" in cards["shared"]["legend"]
    assert cards["quiet"]["charts"] == 0
    assert "no step numbers" in cards["quiet"]["chart_text"]


def test_history_timeline_shows_the_verdict_changes(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdict = {"word": "healthy", "culprits": ()}
    monkeypatch.setattr(
        "monitor.diagnosis.diagnose",
        lambda job: Diagnosis(verdict["word"], verdict["culprits"], None, f"the job is {verdict['word']}"),
    )
    client.post("/api/v1/reports", json=report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now))
    client.get("/diagnose")  # records "healthy"
    clock.advance(60)
    verdict.update(word="deadlock", culprits=(1,))
    shown = render_page(client, tmp_path)  # records "deadlock", then the page asks for the history
    assert "/api/v1/jobs/job-a/history" in shown["fetched"]
    assert shown["fetched"].count("/api/v1/jobs/job-a/history") == 1  # once per change, not on every poll
    card = shown["cards"]["job-a"]
    assert "Verdict history (2 changes)" in card["history"]
    assert card["history_segments"] == ["seg ok", "seg bad"]
    # Newest first, with culprits and summary.
    history = card["history"]
    assert history.index("DEADLOCK") < history.index("HEALTHY")
    assert "rank 1" in history and "the job is deadlock" in history


def test_a_cluster_shows_every_job_and_only_problem_jobs_in_full(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("monitor.diagnosis.diagnose", lambda job: Diagnosis(
        "deadlock" if job.job_id == "job-07" else "healthy", (1,) if job.job_id == "job-07" else (), None, "x"))
    for i in range(25):
        client.post("/api/v1/reports", json=report(node=f"node-{i}", ranks=[rank(job_id=f"job-{i:02d}")],
                                                   sent_at=clock.now))
    urls = ["/diagnose?format=json&view=summary", "/diagnose?format=json&problems=1&limit=20"]
    routes = {url: client.get(url).json() for url in urls}
    routes["/api/v1/jobs/job-07/history"] = client.get("/api/v1/jobs/job-07/history").json()
    answer = tmp_path / "diagnose.json"
    answer.write_text(json.dumps({"jobs": [], "total_jobs": 0}))  # any other /diagnose URL: nothing
    routes_file = tmp_path / "routes.json"
    routes_file.write_text(json.dumps(routes))
    result = subprocess.run(["node", str(Path(__file__).with_name("page_smoke.js")), str(STATIC_DIR / "app.js"),
                             str(answer), str(routes_file)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert all(f"job-{i:02d}" in shown["overview"] for i in range(25))
    assert list(shown["cards"]) == ["job-07"]
    assert "24 more jobs without a problem" in shown["jobs"]
    assert shown["fetched"][:2] == urls
