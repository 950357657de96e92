"""GET /diagnose (text and JSON), job filtering and order, verdict history."""

from __future__ import annotations

from typing import Any

import pytest
from monitor_reports import frame, launcher, orphan, progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient, monitor_of

from monitor.diagnosis import Diagnosis, JobView, RankDiagnosis

URL = "/api/v1/reports"


class StubDiagnosis:
    """Stands in for the real rules: answers whatever verdict the test sets."""

    def __init__(self) -> None:
        self.verdict = "deadlock"
        self.culprits: tuple[int, ...] = (1,)
        self.calls = 0

    def __call__(self, job: JobView) -> Diagnosis:
        self.calls += 1
        ranks = tuple(
            RankDiagnosis(r.rank, "in_collective", top_frame="all_reduce (torch/distributed/distributed_c10d.py:2501)",
                          wait_site="all_reduce@train.py:50")
            for r in job.ranks
        )
        return Diagnosis(
            verdict=self.verdict,
            culprit_ranks=self.culprits,
            since=job.now - 30,
            summary=f"{self.verdict} in {job.job_id}",
            evidence=("rank 1 idle at 0% CPU for 30s",),
            hints=("py-spy dump --pid 1001",),
            ranks=ranks,
        )


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> StubDiagnosis:
    stub = StubDiagnosis()
    monkeypatch.setattr("monitor.diagnosis.diagnose", stub)
    return stub


def post(client: TestClient, body: dict[str, Any]) -> None:
    assert client.post(URL, json=body).status_code == 202


def diagnose_json(client: TestClient, **params: str) -> dict[str, Any]:
    response = client.get("/diagnose", params={"format": "json", **params})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    return response.json()


RANK_KEYS = {"rank": int, "node": str, "pid": int, "state": str, "cpu_percent": float, "step": int,
             "seconds_since_progress": float, "top_frame": str}
JOB_KEYS = {"job_id": str, "verdict": str, "culprit_ranks": list, "since": float, "summary": str,
            "evidence": list, "hints": list, "ranks": list}


def test_json_has_the_contract_shape(client: TestClient, clock: FakeClock, stub: StubDiagnosis) -> None:
    p = progress(5, 50, [(clock.now - 3, 49), (clock.now - 2, 50)])
    post(client, report(ranks=[rank(rank=0, progress=p), rank(rank=1, progress=p)], sent_at=clock.now))
    clock.advance(10)
    data = diagnose_json(client)
    assert set(data) == {"jobs", "total_jobs", "monitor"}
    [job] = data["jobs"]
    for key, kind in JOB_KEYS.items():
        assert isinstance(job[key], kind), key
    assert job["verdict"] == "deadlock"
    assert job["culprit_ranks"] == [1]
    assert job["since"] == pytest.approx(clock.now - 30)
    assert job["evidence"] == ["rank 1 idle at 0% CPU for 30s"]
    assert job["hints"] == ["py-spy dump --pid 1001"]
    for r in job["ranks"]:
        for key, kind in RANK_KEYS.items():
            assert isinstance(r[key], kind), key
    r0 = job["ranks"][0]
    assert (r0["rank"], r0["node"], r0["pid"], r0["state"], r0["step"]) == (0, "node-a", 1000, "in_collective", 50)
    assert r0["cpu_percent"] == 95.0
    assert r0["seconds_since_progress"] == pytest.approx(12.0)
    assert r0["top_frame"] == "all_reduce (torch/distributed/distributed_c10d.py:2501)"


def test_seconds_since_progress_falls_back_on_the_job_and_is_null_without_any(
    client: TestClient, clock: FakeClock
) -> None:
    job_progress = progress(2, 7, [(clock.now - 4, 7)], scope="job")
    post(client, report(ranks=[rank(job_id="shared", progress=job_progress)], sent_at=clock.now))
    post(client, report(node="node-b", ranks=[rank(job_id="quiet")], sent_at=clock.now))
    by_id = {j["job_id"]: j for j in diagnose_json(client)["jobs"]}
    assert by_id["shared"]["ranks"][0]["seconds_since_progress"] == pytest.approx(4.0)
    assert by_id["quiet"]["ranks"][0]["seconds_since_progress"] is None
    assert by_id["quiet"]["ranks"][0]["step"] is None
    assert by_id["quiet"]["ranks"][0]["top_frame"] is None


def test_each_rank_has_its_progress_points_else_the_jobs(client: TestClient, clock: FakeClock) -> None:
    skew = -60.0  # points are shifted onto the monitor's clock
    own = progress(2, 11, [(clock.now + skew - 2, 10), (clock.now + skew - 1, 11)])
    post(client, report(ranks=[rank(rank=0, progress=own), rank(rank=1)], sent_at=clock.now + skew))
    job_log = progress(1, 7, [(clock.now - 4, 7)], scope="job")
    post(client, report(node="node-b", ranks=[rank(job_id="shared", rank=r, progress=job_log) for r in (0, 1)],
                        sent_at=clock.now))
    by_id = {j["job_id"]: j for j in diagnose_json(client)["jobs"]}
    r0, r1 = by_id["job-a"]["ranks"]
    assert r0["progress"] == [[pytest.approx(clock.now - 2), 10], [pytest.approx(clock.now - 1), 11]]
    assert r1["progress"] == []
    # Ranks sharing a job-scope log show the job's points.
    assert [r["progress"] for r in by_id["shared"]["ranks"]] == [[[clock.now - 4, 7]]] * 2
    # The contract fields are all still there.
    assert set(RANK_KEYS) <= set(r0)


def test_agent_clock_skew_is_shifted_away(client: TestClient, clock: FakeClock) -> None:
    agent_now = clock.now - 3600  # the agent's clock is an hour behind
    p = progress(1, 1, [(agent_now - 5, 1)])
    post(client, report(ranks=[rank(progress=p, stack=stack(agent_now - 1))], sent_at=agent_now))
    [job] = diagnose_json(client)["jobs"]
    assert job["ranks"][0]["seconds_since_progress"] == pytest.approx(5.0)
    [view] = [r.view for r in monitor_of(client).results()]
    assert view.ranks[0].stack is not None
    assert view.ranks[0].stack.taken_at == pytest.approx(clock.now - 1)


def test_most_recently_active_job_comes_first_and_job_filters(client: TestClient, clock: FakeClock) -> None:
    for job_id in ("old", "new"):
        post(client, report(node=f"node-{job_id}", ranks=[rank(job_id=job_id)], sent_at=clock.now))
        clock.advance(1)
    assert [j["job_id"] for j in diagnose_json(client)["jobs"]] == ["new", "old"]
    post(client, report(node="node-old", ranks=[rank(job_id="old")], sent_at=clock.now))
    assert [j["job_id"] for j in diagnose_json(client)["jobs"]] == ["old", "new"]
    assert [j["job_id"] for j in diagnose_json(client, job="new")["jobs"]] == ["new"]


def test_an_unknown_job_is_a_404_that_says_so(client: TestClient, clock: FakeClock) -> None:
    post(client, report(ranks=[rank(job_id="known")], sent_at=clock.now))
    answer = client.get("/diagnose", params={"format": "json", "job": "nope"})
    assert answer.status_code == 404 and answer.headers["content-type"] == "application/json"
    body = answer.json()
    # Still a /diagnose answer (no jobs, the monitor's state), and not FastAPI's "Not Found" of a wrong path.
    assert body["detail"] == "no job 'nope'" and body["job"] == "nope", body
    assert body["jobs"] == [] and body["total_jobs"] == 0 and body["monitor"]["jobs"] == 1, body
    for params in ({"job": "nope"}, {"job": "nope", "view": "summary"}):
        text = client.get("/diagnose", params=params)
        assert text.status_code == 404 and text.headers["content-type"].startswith("text/plain")
        assert text.text == "hangwatch: no job 'nope'\n"
    summary = client.get("/diagnose", params={"format": "json", "view": "summary", "job": "nope"})
    assert summary.status_code == 404 and summary.json()["jobs"] == []


def test_a_known_job_filtered_or_paged_out_is_no_404(client: TestClient, clock: FakeClock,
                                                     stub: StubDiagnosis) -> None:
    stub.verdict, stub.culprits = "healthy", ()
    post(client, report(ranks=[rank(job_id="known")], sent_at=clock.now))
    assert [j["verdict"] for j in diagnose_json(client, job="known")["jobs"]] == ["healthy"]
    problems = client.get("/diagnose", params={"format": "json", "job": "known", "problems": "1"})
    assert problems.status_code == 200 and problems.json()["jobs"] == [], problems.text
    paged = client.get("/diagnose", params={"format": "json", "job": "known", "offset": "1"})
    assert paged.status_code == 200 and paged.json()["jobs"] == [] and paged.json()["total_jobs"] == 1


def test_text_report_reads_well(client: TestClient, clock: FakeClock, stub: StubDiagnosis) -> None:
    post(client, report(ranks=[rank(rank=0), rank(rank=1, cpu_percent=0.0)], sent_at=clock.now))
    response = client.get("/diagnose")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert text.startswith("JOB job-a  DEADLOCK  since 30s (")
    assert "deadlock in job-a" in text
    assert "  culprits: rank 1 (marked * below)" in text
    assert "rank 1 idle at 0% CPU for 30s" in text
    assert "py-spy dump --pid 1001" in text
    header = next(line for line in text.splitlines() if "RANK" in line)
    assert header.split()[:4] == ["RANK", "NODE", "PID", "STATE"]
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("0 ", "1* "))]
    assert [row[:4] for row in rows] == [["0", "node-a", "1000", "in_collective"], ["1*", "node-a", "1001", "in_collective"]]


def test_text_report_without_jobs(client: TestClient) -> None:
    answer = client.get("/diagnose")
    assert answer.status_code == 200 and "no jobs" in answer.text


def test_bad_format_is_a_422(client: TestClient) -> None:
    assert client.get("/diagnose", params={"format": "xml"}).status_code == 422


def test_verdict_changes_are_recorded_once_each(client: TestClient, clock: FakeClock, stub: StubDiagnosis) -> None:
    post(client, report(ranks=[rank(rank=0), rank(rank=1)], sent_at=clock.now))
    monitor = monitor_of(client)
    stub.verdict, stub.culprits = "healthy", ()
    monitor.tick()
    clock.advance(5)
    monitor.tick()  # same verdict: nothing new
    stub.verdict, stub.culprits = "deadlock", (1,)
    clock.advance(5)
    client.get("/diagnose")
    history = client.get("/api/v1/jobs/job-a/history").json()
    assert history["job_id"] == "job-a"
    assert [(h["verdict"], h["culprit_ranks"]) for h in history["history"]] == [("healthy", []), ("deadlock", [1])]
    assert history["history"][1]["at"] == clock.now
    assert history["history"][1]["summary"] == "deadlock in job-a"


def test_history_of_a_job_whose_id_has_slashes(client: TestClient, clock: FakeClock, stub: StubDiagnosis) -> None:
    post(client, report(ranks=[rank(job_id="team/run 7", rank=0)], sent_at=clock.now))
    monitor_of(client).tick()
    history = client.get("/api/v1/jobs/team%2Frun%207/history")
    assert history.status_code == 200 and history.json()["job_id"] == "team/run 7"


def test_history_of_an_unknown_job_is_404(client: TestClient) -> None:
    assert client.get("/api/v1/jobs/nope/history").status_code == 404


def test_a_failing_diagnosis_does_not_break_the_report(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(job: JobView) -> Diagnosis:
        raise ZeroDivisionError

    monkeypatch.setattr("monitor.diagnosis.diagnose", broken)
    post(client, report(sent_at=clock.now))
    [job] = diagnose_json(client)["jobs"]
    assert "diagnosis failed" in job["summary"]
    assert job["ranks"][0]["state"] == "unknown"
    assert "diagnosis failed for job 'job-a'" in caplog.text


def test_health(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200


def test_sync_points_are_learnt_through_the_diagnosis_hook(client: TestClient, clock: FakeClock) -> None:
    # A rank seen waiting in all_reduce, then the job progresses: that all_reduce is a regular sync point.
    first = rank(stack=stack(clock.now, active=False), cpu_percent=0.0, progress=progress(1, 1, [(clock.now - 1, 1)]))
    post(client, report(ranks=[first], sent_at=clock.now))
    clock.advance(1)
    later = rank(cpu_percent=90.0, progress=progress(2, 2, [(clock.now - 1, 1), (clock.now, 2)]))
    post(client, report(ranks=[later], sent_at=clock.now))
    [result] = monitor_of(client).results()
    assert any("all_reduce" in site for site in result.view.known_wait_sites)


JOB_KEYS_ISSUE_3 = {"groups": list, "stack_groups": list, "launchers": list, "orphans": list, "world_size": int}
LAUNCHER_KEYS = {"node", "pid", "alive", "node_rank", "nnodes", "worker_count", "top_frame"}


def test_json_carries_launchers_orphans_stack_groups_and_wait_share(client: TestClient, clock: FakeClock) -> None:
    other = [frame("barrier", "/x/site-packages/torch/distributed/distributed_c10d.py", 4100),
             frame("save", "/work/train.py", 150)]
    agent_frames = [frame("_invoke_run", "/x/site-packages/torch/distributed/elastic/agent/server/api.py", 900)]
    for i in range(6):
        ranks = [rank(rank=0, world_size=3, stack=stack(clock.now, frames=other)),
                 rank(rank=1, world_size=3, stack=stack(clock.now)), rank(rank=2, world_size=3, stack=stack(clock.now))]
        body = report(ranks=ranks, sent_at=clock.now, orphans=[orphan(4242, "torchrun train.py", [29500])],
                      launchers=[launcher(worker_pids=[1000, 1001, 1002], stack=stack(clock.now, frames=agent_frames))])
        post(client, body)
        clock.advance(1)
    [job] = diagnose_json(client)["jobs"]
    for key, kind in {**JOB_KEYS, **JOB_KEYS_ISSUE_3}.items():
        assert isinstance(job[key], kind) or (key == "since" and job[key] is None), key
    for r in job["ranks"]:
        for key, kind in RANK_KEYS.items():
            if r[key] is not None:
                assert isinstance(r[key], kind), key
        assert r["collective_wait_share"] == 1.0  # six distinct stacks, all in a collective
    assert job["stack_groups"][0]["ranks"] == [1, 2]
    assert job["stack_groups"][0]["frames"][0] == "all_reduce (torch/distributed/distributed_c10d.py:2501)"
    assert job["stack_groups"][1] == {"ranks": [0], "frames": [
        "barrier (torch/distributed/distributed_c10d.py:4100)", "save (train.py:150)"]}
    [lj] = job["launchers"]
    assert LAUNCHER_KEYS <= set(lj)
    assert (lj["node"], lj["pid"], lj["alive"], lj["node_rank"], lj["nnodes"], lj["worker_count"]) == (
        "node-a", 900, True, 0, "2", 3)
    assert lj["top_frame"] == "_invoke_run (torch/distributed/elastic/agent/server/api.py:900)"
    assert job["orphans"] == [{"node": "node-a", "pid": 4242, "cmdline": "torchrun train.py", "listening_ports": [29500]}]

    text = client.get("/diagnose").text
    assert "ranks 1,2: all_reduce (torch/distributed/distributed_c10d.py:2501) ← wrapper (" in text
    assert "rank 0: barrier (torch/distributed/distributed_c10d.py:4100) ← save (train.py:150)" in text
    assert "launchers:\n    node-a pid 900, node 0 of 2, 3 workers, alive, at _invoke_run (" in text
    assert "node-a pid 4242 (listening on 29500): torchrun train.py" in text
    header = next(line for line in text.splitlines() if "RANK" in line)
    assert "WAIT%" in header.split()
    row = next(line for line in text.splitlines() if line.strip().startswith("1 "))
    assert row.split()[header.split().index("WAIT%")] == "100"


def test_a_launcher_only_job_is_reported(client: TestClient, clock: FakeClock) -> None:
    post(client, report(ranks=[], launchers=[launcher(nnodes="2", nproc_per_node="4")], sent_at=clock.now))
    [job] = diagnose_json(client)["jobs"]
    assert (job["job_id"], job["world_size"], job["ranks"], job["stack_groups"]) == ("job-a", 8, [], [])
    assert [lj["pid"] for lj in job["launchers"]] == [900]
    text = client.get("/diagnose").text
    assert "no rank seen yet, world size 8 by its launcher's options; the launcher runs on node-a" in text
    assert "no rank has started yet" in text and "RANK" not in text


def test_text_shows_the_wait_groups(client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    from monitor.diagnosis import WaitGroup

    def grouped(job: JobView) -> Diagnosis:
        groups = (WaitGroup("all_reduce@train.py:50", (0, 1, 2)), WaitGroup("barrier@train.py:80", (3,)))
        return Diagnosis("deadlock", (3,), job.now, "rank 3 waits elsewhere", groups=groups)

    monkeypatch.setattr("monitor.diagnosis.diagnose", grouped)
    post(client, report(ranks=[rank(rank=r, world_size=4) for r in range(4)], sent_at=clock.now))
    text = client.get("/diagnose").text
    assert "waiting at:\n    ranks 0-2: all_reduce@train.py:50\n    rank 3: barrier@train.py:80" in text
    [job] = diagnose_json(client)["jobs"]
    assert job["groups"] == [{"site": "all_reduce@train.py:50", "ranks": [0, 1, 2]},
                             {"site": "barrier@train.py:80", "ranks": [3]}]


def test_one_job_under_two_spellings_of_its_master_is_listed_once_and_found_by_either(
    client: TestClient, clock: FakeClock
) -> None:
    def host(name: str, address: str) -> dict:
        return {"hostname": name, "interfaces": [{"name": "eth0", "addresses": [f"{address}/24"]}]}

    post(client, report(node="node-a", host=host("node-a", "10.0.0.1"), sent_at=clock.now,
                        ranks=[rank(job_id="node-a:29500", rank=0, world_size=2)]))
    post(client, report(node="node-b", host=host("node-b", "10.0.0.2"), sent_at=clock.now,
                        ranks=[rank(job_id="10.0.0.1:29500", rank=1, world_size=2)]))
    [job] = diagnose_json(client)["jobs"]
    assert (job["job_id"], job["aliases"]) == ("node-a:29500", ["10.0.0.1:29500"])
    assert [(r["rank"], r["node"]) for r in job["ranks"]] == [(0, "node-a"), (1, "node-b")]
    found = client.get("/diagnose", params={"format": "json", "job": "10.0.0.1:29500"}).json()["jobs"]
    assert [j["job_id"] for j in found] == ["node-a:29500"]
    assert client.get("/api/v1/jobs/10.0.0.1:29500/history").status_code == 200
    assert "also reported as 10.0.0.1:29500" in client.get("/diagnose").text
