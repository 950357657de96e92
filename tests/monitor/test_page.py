"""GET /: the status page is self-contained (works offline), polls the JSON report and updates in place;
the data it shows beside the report (rank timelines, the evidence download, its links) comes from the monitor."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from monitor_reports import ALL_REDUCE_FRAMES, frame, launcher, orphan, progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient, post_report

from monitor.web.app import create_app
from monitor.diagnosis import Diagnosis, RankDiagnosis
from monitor.web.page_links import RUNBOOK_SECTIONS
from monitor.web.routes.page import STATIC_DIR
from monitor.web.settings import Settings, SettingsError
from monitor.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("dom.js", "app.js")
GRAFANA = "https://grafana.example.com/d/hangwatch?var-job={job}"
RUNBOOK = "https://git.example.com/hangwatch/blob/main/docs/runbook.md"

SVG_NS = "http://www.w3.org/2000/svg"


def test_page_is_html_with_local_resources_only(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "<title>hangwatch</title>" in html
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert "/static/dom.js" in refs and "/static/app.js" in refs and "/static/style.css" in refs
    assert refs.index("/static/dom.js") < refs.index("/static/app.js")  # app.js uses what dom.js defines
    assert not re.search(r"<script>|<script [^>]*>[^<]", html)  # no inline script (the CSP forbids them)
    assert not [r for r in refs if "//" in r]
    # An empty data: icon, so the browser asks for no /favicon.ico.
    assert '<link rel="icon" href="data:,">' in html


def test_script_and_style_are_served_and_poll_the_json_report(client: TestClient) -> None:
    scripts = {}
    for name in SCRIPTS:
        script = client.get(f"/static/{name}")
        assert script.status_code == 200
        assert "javascript" in script.headers["content-type"]
        assert "innerHTML" not in script.text.replace("never innerHTML", "")
        scripts[name] = script.text
    assert "/diagnose?format=json" in scripts["app.js"]
    assert "2000" in scripts["app.js"]
    # The SVG namespace name is the one address allowed: it is never fetched.
    both = "".join(scripts.values())
    assert both.count(SVG_NS) == 1
    assert not re.search(r"https?://", both.replace(SVG_NS, ""))
    style = client.get("/static/style.css")
    assert style.status_code == 200
    assert not re.search(r"https?://|@import", style.text)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_parses(name: str) -> None:
    result = subprocess.run(["node", "--check", str(STATIC_DIR / name)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def run_page(tmp_path: Path, answer: dict[str, Any], routes: dict[str, Any], polls: int = 1,
             tz: str = "UTC") -> dict[str, Any]:
    """What the page's scripts show (tests/monitor/page_smoke.js) for these answers, in time zone ``tz``."""
    answer_file, routes_file = tmp_path / "diagnose.json", tmp_path / "routes.json"
    answer_file.write_text(json.dumps(answer))
    routes_file.write_text(json.dumps(routes))
    result = subprocess.run(
        ["node", str(Path(__file__).with_name("page_smoke.js")), str(STATIC_DIR), str(answer_file), str(routes_file),
         str(polls)],
        capture_output=True, text=True, timeout=30, env={**os.environ, "TZ": tz},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def side_url(job_id: str, part: str) -> str:
    """The URL the page fetches for a job's history or timeline (the timeline: no rank one by one,
    16 groups of states and 8 of progress at most)."""
    return f"/api/v1/jobs/{job_id}/{part}" + ("?limit=0&rows=16&lines=8" if part == "timeline" else "")


def render_page(client: TestClient, tmp_path: Path, polls: int = 1, tz: str = "UTC") -> dict[str, Any]:
    """What the page shows for the monitor's current answer; each job's history and timeline come from the monitor too."""
    data = client.get("/diagnose", params={"format": "json"}).json()
    routes = {}
    for job in data["jobs"]:
        for part in ("history", "timeline"):
            url = side_url(job["job_id"], part)
            routes[url] = client.get(url).json()
    return run_page(tmp_path, data, routes, polls, tz)


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
    assert "all_reduce (torch/distributed/distributed_c10d.py:2501)" in jobs  # rank 1's, in the merged tree
    assert "node-a pid 900, node 0 of 2, 2 workers, alive" in jobs
    assert "node-a pid 4242 (listening on 29500): torchrun stale.py" in jobs
    verdict["word"] = "healthy"
    jobs = render_page(client, tmp_path)["jobs"]
    assert "save_checkpoint (train.py:150)" not in jobs  # stacks only for jobs in trouble
    assert "torchrun stale.py" in jobs


def test_chart_draws_one_line_per_way_of_progressing_and_marks_since_when_in_trouble(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdict = {"word": "healthy"}
    monkeypatch.setattr("monitor.diagnosis.diagnose",
                        lambda job: Diagnosis(verdict["word"], (1,), job.now - 20, f"{verdict['word']} now"))
    now = clock.now
    # Ten steps apart: three ways of progressing (a step apart would be ranks in lockstep, one line).
    ranks = [rank(rank=r, world_size=3,
                  progress=progress(3, 30 + 10 * r, [(now - 90, 10 + 10 * r), (now - 60, 20 + 10 * r),
                                                     (now - 30, 30 + 10 * r)]))
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
    assert "rank 0 (step 30)" in card["legend"] and "rank 2 (step 50)" in card["legend"]

    verdict["word"] = "deadlock"
    clock.advance(5)
    card = render_page(client, tmp_path)["cards"]["job-a"]
    assert card["since_markers"] == 1
    assert "deadlock since" in card["chart_text"]


def test_ranks_sharing_a_job_log_share_one_line_and_no_steps_says_so(client: TestClient, clock: FakeClock,
                                                                    tmp_path: Path) -> None:
    shared = progress(2, 8, [(clock.now - 10, 7), (clock.now - 5, 8)], scope="job")
    body = report(ranks=[rank(job_id="shared", rank=r, world_size=4, progress=shared) for r in range(4)], sent_at=clock.now)
    client.post("/api/v1/reports", json=body)
    client.post("/api/v1/reports", json=report(node="node-b", ranks=[rank(job_id="quiet")], sent_at=clock.now))
    cards = render_page(client, tmp_path)["cards"]
    assert [p["ranks"] for p in cards["shared"]["paths"]] == ["0-3"]
    assert "ranks 0-3 (4 ranks, step 8)" in cards["shared"]["legend"]
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
    assert "Verdict history (2 changes, as named)" in card["history"]
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
    for part in ("history", "timeline"):
        routes[side_url("job-07", part)] = client.get(side_url("job-07", part)).json()
    # Any other /diagnose URL: nothing.
    shown = run_page(tmp_path, {"jobs": [], "total_jobs": 0}, routes)
    assert all(f"job-{i:02d}" in shown["overview"] for i in range(25))
    assert list(shown["cards"]) == ["job-07"]
    assert "24 more jobs without a problem" in shown["jobs"]
    assert shown["fetched"][:2] == urls


# --- the page during an incident (issue 10) ---

NATIVE_WAIT = [frame("pthread_cond_wait", native=True), frame("c10d::Work::wait", native=True)]
LINGER_FRAMES = [frame("linger_forever", "/work/train.py", 12), frame("<module>", "/work/train.py", 90)]


@pytest.fixture
def linked_client(settings: Settings, store: Store, clock: FakeClock) -> Iterator[TestClient]:
    """A monitor started with --grafana-url and --runbook-url."""
    linked = Settings.from_raw({**{f: getattr(settings, f) for f in ("db", "tick_interval_s", "confirm_alarms")},
                                "grafana_url": GRAFANA, "runbook_url": RUNBOOK})
    with TestClient(create_app(linked, store, clock=clock)) as client:
        yield client


def post_deadlock(client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, readings: int = 1) -> None:
    """Rank 0 waits in all_reduce (native frames under it), rank 1 lingers elsewhere; diagnosed each reading."""
    states = iter(["running", "idle", "idle", "idle", "idle", "idle"])
    state_of_1 = {"now": "running"}
    monkeypatch.setattr("monitor.diagnosis.diagnose", lambda job: Diagnosis(
        "deadlock", (1,), job.now - 30, "rank 0 waits in all_reduce; rank 1 never reached it",
        ranks=(RankDiagnosis(0, "in_collective"), RankDiagnosis(1, state_of_1["now"]))))
    waiting = stack(clock.now, frames=NATIVE_WAIT + ALL_REDUCE_FRAMES, native=True)
    lingering = stack(clock.now, frames=LINGER_FRAMES)
    for _ in range(readings):
        state_of_1["now"] = next(states)
        body = report(ranks=[rank(rank=0, stack=waiting, cpu_percent=0.0), rank(rank=1, stack=lingering, cpu_percent=0.0)],
                      sent_at=clock.now)
        client.post("/api/v1/reports", json=body)
        client.get("/diagnose")
        clock.advance(10)


def test_a_second_poll_updates_the_page_in_place(client: TestClient, clock: FakeClock, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    post_deadlock(client, clock, monkeypatch, readings=2)
    shown = render_page(client, tmp_path, polls=2)
    assert shown["fetched"].count("/diagnose?format=json") == 2  # two polls
    # The same answer again: not one node made, every node of the first poll still in place.
    assert shown["second"] == {"created": 0, "kept": True}


def test_merged_stack_tree_marks_the_missing_ranks_and_folds_native_frames(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    post_deadlock(client, clock, monkeypatch)
    card = render_page(client, tmp_path)["cards"]["job-a"]
    rows = [(row["text"], row["style"], [m["cls"] for m in row["missing"]]) for row in card["tree"]]
    assert rows == [
        ("ranks 0,1 <module> (train.py:90)", "padding-left: 0.0em", []),
        ("rank 0 train_step (train.py:50) missing: rank 1", "padding-left: 1.1em", ["missing new"]),
        ("rank 0 wrapper (torch/distributed/c10d_logger.py:83) missing: rank 1", "padding-left: 1.1em", ["missing"]),
        ("rank 0 all_reduce (torch/distributed/distributed_c10d.py:2501) missing: rank 1", "padding-left: 1.1em",
         ["missing"]),
        # Folded by default: the two native frames under all_reduce are one row with its toggle.
        ("rank 0 2 native frames missing: rank 1", "padding-left: 1.1em", ["missing"]),
        ("rank 1 linger_forever (train.py:12) missing: rank 0", "padding-left: 1.1em", ["missing new"]),
    ]
    assert card["tree"][4]["cls"] == "node fold"
    assert "show 2 native frames" in card["tree_title"]


def test_healthy_jobs_get_no_stack_tree(client: TestClient, clock: FakeClock) -> None:
    client.post("/api/v1/reports", json=report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now))
    job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
    assert job["verdict"] == "healthy" and job["stack_tree"] is None


def test_rank_timeline_draws_each_ranks_states_culprits_first(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    post_deadlock(client, clock, monkeypatch, readings=4)  # rank 1 running at 0 s, idle from 10 s on
    timeline = client.get("/api/v1/jobs/job-a/timeline").json()
    start = clock.now - 40
    assert timeline["ranks"] == [
        {"rank": 0, "spans": [[start, clock.now, "in_collective"]]},
        {"rank": 1, "spans": [[start, start + 10, "running"], [start + 10, clock.now, "idle"]]},
    ]
    assert [(g["ranks"], g["count"], g["culprit"], g["spans"]) for g in timeline["groups"]] == [
        ("1", 1, True, [[start, start + 10, "running"], [start + 10, clock.now, "idle"]]),
        ("0", 1, False, [[start, clock.now, "in_collective"]])]
    rows = render_page(client, tmp_path)["cards"]["job-a"]["timeline"]
    assert [(r["rank"], r["cls"]) for r in rows] == [("1", "trow culprit"), ("0", "trow")]
    culprit, waiting = rows
    # The bar covers at least a minute: before the job was seen no state, then each state for as
    # long as it lasted (flex-grow: seconds).
    assert [(s["cls"], s["style"]) for s in culprit["segments"]] == [
        ("seg none", "flex-grow: 20.000"), ("seg st-running", "flex-grow: 10.000"), ("seg st-idle", "flex-grow: 30.000")]
    assert [s["cls"] for s in waiting["segments"]] == ["seg none", "seg st-in_collective"]
    # The fake clock's day is not today: the date comes first.
    assert re.fullmatch(r"rank 1: idle \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC – now", culprit["segments"][2]["title"])


def test_timeline_limit_keeps_the_culprits_first_and_counts_the_rest(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    post_deadlock(client, clock, monkeypatch, readings=2)  # rank 1 is the culprit
    one = client.get("/api/v1/jobs/job-a/timeline", params={"limit": 1}).json()
    assert [r["rank"] for r in one["ranks"]] == [1] and one["ranks_total"] == 2
    both = client.get("/api/v1/jobs/job-a/timeline", params={"limit": 64}).json()
    assert [r["rank"] for r in both["ranks"]] == [0, 1] and both["ranks_total"] == 2
    # None one by one: the groups only (what the page asks for).
    none = client.get("/api/v1/jobs/job-a/timeline", params={"limit": 0, "rows": 1}).json()
    assert none["ranks"] == [] and [g["ranks"] for g in none["groups"]] == ["1"]
    assert none["groups_total"] == 2 and none["ranks_not_drawn"] == 1
    for bad in ({"limit": -1}, {"rows": 0}, {"lines": 0}, {"rows": 1001}):
        assert client.get("/api/v1/jobs/job-a/timeline", params=bad).status_code == 422, bad


def test_timeline_of_an_unknown_job_is_404(client: TestClient) -> None:
    assert client.get("/api/v1/jobs/nope/timeline").status_code == 404
    assert client.get("/api/v1/jobs/nope/evidence").status_code == 404


def test_evidence_is_one_download_with_the_job_its_history_and_timeline(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    post_deadlock(client, clock, monkeypatch, readings=2)
    response = client.get("/api/v1/jobs/job-a/evidence")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert re.fullmatch(r'attachment; filename="hangwatch-evidence-job-a-\d{8}T\d{6}Z\.json"',
                        response.headers["content-disposition"])
    evidence = response.json()
    assert evidence["job"]["job_id"] == "job-a" and evidence["job"]["verdict"] == "deadlock"
    assert evidence["job"]["stack_tree"]["roots"][0]["frame"] == "<module> (train.py:90)"
    assert [c["verdict"] for c in evidence["history"]] == ["deadlock"]
    assert [r["rank"] for r in evidence["rank_timeline"]["ranks"]] == [0, 1]
    assert [g["ranks"] for g in evidence["rank_timeline"]["groups"]] == ["1", "0"]
    assert "links" in evidence["monitor"]


def test_evidence_file_name_keeps_only_safe_characters(client: TestClient, clock: FakeClock) -> None:
    job_id = '.a/b"c\nd:29500'
    post_report(client, report(ranks=[rank(job_id=job_id)], sent_at=clock.now))
    response = client.get(f"/api/v1/jobs/{quote(job_id, safe='')}/evidence")
    assert response.status_code == 200, response.text
    assert re.fullmatch(r'attachment; filename="hangwatch-evidence-a_b_c_d_29500-\d{8}T\d{6}Z\.json"',
                        response.headers["content-disposition"])


def test_links_to_grafana_and_the_runbook_section_when_configured(
    linked_client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    post_deadlock(linked_client, clock, monkeypatch)
    card = render_page(linked_client, tmp_path)["cards"]["job-a"]
    assert card["links"][:3] == [
        {"href": "/api/v1/jobs/job-a/evidence", "download": "", "text": "download evidence (JSON)"},
        {"href": "https://grafana.example.com/d/hangwatch?var-job=job-a", "download": None, "text": "Grafana"},
        {"href": RUNBOOK + "#deadlock", "download": None, "text": "runbook: deadlock"},
    ]


def test_by_default_the_runbook_link_is_the_monitors_own_page(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --runbook-url: the verdict's section of the runbook this monitor serves (GET /runbook); no Grafana."""
    post_deadlock(client, clock, monkeypatch)
    links = render_page(client, tmp_path)["cards"]["job-a"]["links"]
    assert links[:2] == [
        {"href": "/api/v1/jobs/job-a/evidence", "download": "", "text": "download evidence (JSON)"},
        {"href": "/runbook#deadlock", "download": None, "text": "runbook: deadlock"},
    ]
    assert client.get("/runbook").status_code == 200


def test_every_runbook_section_the_page_links_to_exists() -> None:
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "runbook.md").read_text(), re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    assert set(RUNBOOK_SECTIONS.values()) <= anchors, set(RUNBOOK_SECTIONS.values()) - anchors


@pytest.mark.parametrize("name", ["grafana_url", "runbook_url"])
def test_link_settings_take_only_web_addresses(name: str, tmp_path: Path) -> None:
    variable = f"HANGWATCH_{name.upper()}"
    env = {variable: "javascript:alert(1)", "HANGWATCH_DB": str(tmp_path / "m.db")}
    with pytest.raises(SettingsError, match=f"^{variable} must be an http:// or https:// address"):
        Settings.load(env=env)
    assert getattr(Settings.load(env={**env, variable: "https://x.example/a"}), name) == "https://x.example/a"
    # A path on this monitor, as the runbook's default is; never one a browser reads as another site.
    assert getattr(Settings.load(env={**env, variable: "/runbook"}), name) == "/runbook"
    for elsewhere in ("//x.example/a", "/\\x.example/a", "/\t/x.example/a", "runbook"):
        with pytest.raises(SettingsError, match=f"^{variable} must be an http:// or https:// address"):
            Settings.load(env={**env, variable: elsewhere})


@pytest.mark.parametrize(("tz", "zone"), [("UTC", "UTC"), ("Asia/Kolkata", "UTC+05:30"), ("America/Caracas", "UTC-04:00")])
def test_times_carry_their_zone(client: TestClient, clock: FakeClock, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch, tz: str, zone: str) -> None:
    post_deadlock(client, clock, monkeypatch, readings=2)
    shown = render_page(client, tmp_path, tz=tz)
    time_at = r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d"
    assert re.fullmatch(f"updated {time_at} {re.escape(zone)}", shown["status"]), shown["status"]
    card = shown["cards"]["job-a"]
    for label in ("since", "last report"):
        assert re.search(f"{label} {time_at} {re.escape(zone)}", card["text"]), card["text"]
    history_times = re.findall(f"{time_at} ([^ ]+)", card["history"])
    assert history_times and all(z == zone for _, z in history_times), card["history"]


def test_a_giant_job_shows_its_ranks_in_groups_and_says_which_ranks_are_listed(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = 300  # past the 256 ranks an answer lists by default
    monkeypatch.setattr("monitor.diagnosis.diagnose", lambda job: Diagnosis(
        "deadlock", (5,), job.now - 30, "ranks 0-4,6-299 wait in all_reduce; rank 5 never reached it",
        ranks=tuple(RankDiagnosis(r.rank, "idle", "main (train.py:131)") if r.rank == 5 else
                    RankDiagnosis(r.rank, "in_collective", "all_reduce (distributed_c10d.py:2501)",
                                  "all_reduce@train.py:50") for r in job.ranks)))
    for first in range(0, size, 50):  # 50 ranks a node
        body = report(node=f"node-{first // 50}", sent_at=clock.now,
                      ranks=[rank(rank=r, world_size=size) for r in range(first, first + 50)])
        assert client.post("/api/v1/reports", json=body).status_code == 202
    answer = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
    assert answer["rank_groups_total"] == 2
    assert [(g["ranks"], g["count"], g["state"], g["where"], g["culprit"]) for g in answer["rank_groups"]] == [
        ("5", 1, "idle", "main (train.py:131)", True),
        ("0-4,6-299", 299, "in_collective", "all_reduce@train.py:50", False)]
    jobs = render_page(client, tmp_path)["jobs"]
    assert "Ranks by state and place (2 groups)" in jobs
    assert "0-4,6-299" in jobs and "main (train.py:131)" in jobs
    assert "256 of 300 ranks listed (the culprits, then the lowest ranks)" in jobs
    assert "ranks_offset=0&ranks_limit=1000" in jobs


def test_a_2000_rank_deadlock_draws_the_culprit_and_the_rest_as_one_row_and_one_line(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size, culprit = 2000, 5
    verdict = {"word": "healthy"}
    monkeypatch.setattr("monitor.diagnosis.diagnose", lambda job: Diagnosis(
        verdict["word"], (culprit,) if verdict["word"] == "deadlock" else (), job.now - 30, "rank 5 never reached all_reduce",
        ranks=tuple(RankDiagnosis(r.rank, "idle" if r.rank == culprit else "in_collective") for r in job.ranks)))
    now = clock.now
    for first in range(0, size, 50):  # 50 ranks a node; each rank logs its steps a little apart, up to step 100
        body = report(node=f"node-{first // 50}", sent_at=now, ranks=[
            rank(rank=r, world_size=size, progress=progress(10, 100, [(now - 90 + 10 * i + (r % 7) * 0.3, 91 + i)
                                                                      for i in range(10)]))
            for r in range(first, first + 50)])
        assert client.post("/api/v1/reports", json=body).status_code == 202
    client.get("/diagnose")  # healthy: every rank running
    clock.advance(10)
    verdict["word"] = "deadlock"
    client.get("/diagnose")  # then rank 5 idle, the others in all_reduce
    clock.advance(5)
    shown = render_page(client, tmp_path)
    card = shown["cards"]["job-a"]
    rest = "0-4,6-1999"
    assert [(r["rank"], r["cls"]) for r in card["timeline"]] == [(str(culprit), "trow culprit"), (rest, "trow")]
    # The bar covers a minute at least: no state known before the job was seen.
    assert [[s["cls"] for s in r["segments"]] for r in card["timeline"]] == [
        ["seg none", "seg st-running", "seg st-idle"], ["seg none", "seg st-running", "seg st-in_collective"]]
    assert f"ranks {rest} (1,999 ranks)" in shown["jobs"]
    assert "2,000 ranks in 2 groups alike" in shown["jobs"] and "not drawn" not in shown["jobs"]
    # The chart: the culprit's line, and one line for every other rank (however their log times differ).
    assert [p["ranks"] for p in card["paths"]] == [rest, str(culprit)]  # the culprit's drawn last, on top
    assert "rank 5 (step 100)" in card["legend"] and f"ranks {rest} (1,999 ranks, step 100)" in card["legend"]

    # Past the rows and lines the page draws, it says how many groups and ranks it left out.
    data = client.get("/diagnose", params={"format": "json"}).json()
    timeline = client.get(side_url("job-a", "timeline")).json()
    timeline.update(groups_total=5, ranks_not_drawn=7, progress_groups_total=4, progress_ranks_not_drawn=1)
    jobs = run_page(tmp_path, data, {side_url("job-a", "timeline"): timeline})["jobs"]
    assert "3 more groups (7 ranks) not drawn" in jobs and "2 more groups (1 rank) not drawn" in jobs


def test_a_job_whose_ranks_are_all_listed_needs_no_groups(client: TestClient, clock: FakeClock,
                                                          tmp_path: Path) -> None:
    client.post("/api/v1/reports", json=report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now))
    jobs = render_page(client, tmp_path)["jobs"]
    assert "Ranks by state and place" not in jobs and "ranks listed" not in jobs


def test_history_lists_the_incidents_captures_and_actions(
    client: TestClient, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("monitor.diagnosis.diagnose",
                        lambda job: Diagnosis("deadlock", (1,), None, "rank 1 never reached all_reduce"))
    client.post("/api/v1/reports", json=report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now))
    data = client.get("/diagnose", params={"format": "json"}).json()
    routes = {side_url("job-a", part): client.get(side_url("job-a", part)).json() for part in ("history", "timeline")}
    history = routes[side_url("job-a", "history")]
    history["captures"] = [{"id": "job-a-20270115T080000Z", "verdict": "deadlock", "requested_at": clock.now,
                            "nodes_asked": 2, "nodes_received": 1, "bytes": 4096,
                            "download": "/api/v1/captures/job-a-20270115T080000Z"}]
    history["actions"] = [{"at": clock.now, "rule": "restart-culprits", "kind": "signal", "outcome": "ok",
                           "detail": "sent SIGTERM to rank 1 (pid 1001)"},
                          {"at": clock.now, "rule": "cancel", "kind": "command", "outcome": "dry_run",
                           "detail": "would run: scancel 77"},
                          {"at": clock.now, "rule": "requeue", "kind": "command", "outcome": "unattributed",
                           "ran": False, "target": "scontrol requeue -- 77",
                           "detail": "not run: node node-a reports with a shared token (or none)"}]
    card = run_page(tmp_path, data, routes)["cards"]["job-a"]
    assert "evidence captured" in card["history"] and "deadlock: 1/2 nodes, 4 KiB" in card["history"]
    [capture_link] = [link for link in card["links"] if link["href"].startswith("/api/v1/captures/")]
    assert capture_link["href"] == "/api/v1/captures/job-a-20270115T080000Z" and capture_link["download"] == ""
    assert "action restart-culprits (signal): ok" in card["history"]
    assert "sent SIGTERM to rank 1 (pid 1001)" in card["history"]
    assert card["history"].index("action cancel (command): dry run") < card["history"].index("restart-culprits")
    # An unattributed decision shows the command it would have run, though it ran nothing.
    assert "action requeue (command): unattributed" in card["history"]
    assert "scontrol requeue -- 77" in card["history"]


def test_a_launcher_per_node_is_listed_for_a_few_and_counted_for_the_rest(
        client: TestClient, clock: FakeClock, tmp_path: Path) -> None:
    for node in range(20):
        workers = [20_000 + node * 2] if node == 7 else [20_000 + node * 2, 20_001 + node * 2]
        client.post("/api/v1/reports", json=report(node=f"node-{node:03d}", sent_at=clock.now, ranks=[], launchers=[
            launcher(job_id="wide", pid=900 + node, nnodes="20", node_rank=node, worker_pids=workers)]))
    jobs = render_page(client, tmp_path)["jobs"]
    assert "node-007 pid 907, node 7 of 20, 1 workers, alive" in jobs  # the unusual one is listed
    assert "node-006 pid 906" in jobs and "node-007 pid 907" in jobs and "node-008 pid 908" not in jobs
    assert "… 12 more launchers (12 alive, 0 ended)" in jobs
