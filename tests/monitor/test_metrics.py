"""GET /metrics: families built from live state at scrape time."""

from __future__ import annotations

import os
import platform

import psutil
import pytest
from monitor_reports import frame, progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient
from prometheus_client.parser import text_string_to_metric_families

from hangwatch_common.version import version
from monitor.diagnosis import VERDICTS, Diagnosis, JobView
from monitor.web.metrics import JOB_INFO_LABELS
from monitor.web.process_metrics import process_families
from monitor.ingest.retention import SILENT_NODE_KEPT_S


def scrape(client: TestClient) -> dict[str, list[tuple[dict[str, str], float]]]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    matches = [v for lab, v in samples.get(name, []) if lab == labels]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return matches[0]


def test_metrics_follow_the_state(client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    def straggler(job: JobView) -> Diagnosis:
        return Diagnosis("straggler", (1,), job.now, "rank 1 is slow")

    monkeypatch.setattr("monitor.diagnosis.diagnose", straggler)
    p = progress(3, 30, [(clock.now - 5, 30)])
    ranks = [rank(rank=0, progress=p, cpu_seconds=100.0), rank(rank=1, cpu_percent=50.0, cpu_seconds=7.0)]
    collectors = [{"name": "proc", "ok": True}, {"name": "stacks", "ok": False, "error": "py-spy missing"}]
    client.post("/api/v1/reports", json=report(ranks=ranks, collectors=collectors, sent_at=clock.now))
    client.post("/api/v1/reports", content=b"{", headers={"content-type": "application/json"})
    clock.advance(20)
    m = scrape(client)

    for word in VERDICTS:
        assert value(m, "hangwatch_job_verdict", job_id="job-a", verdict=word) == (1.0 if word == "straggler" else 0.0)
    # Times are timestamps: the job last progressed 25 s before the scrape, its agent reported 20 s before.
    assert value(m, "hangwatch_job_last_progress_timestamp_seconds", job_id="job-a") == pytest.approx(clock.now - 25)
    assert value(m, "hangwatch_rank_last_progress_timestamp_seconds", job_id="job-a", rank="0",
                 node="node-a") == pytest.approx(clock.now - 25)
    # Rank 1 never progressed (nor did the job as a whole): no made-up time.
    assert [lab["rank"] for lab, _ in m["hangwatch_rank_last_progress_timestamp_seconds"]] == ["0"]
    assert value(m, "hangwatch_rank_cpu_seconds_total", job_id="job-a", rank="0", node="node-a") == 100.0
    assert value(m, "hangwatch_rank_cpu_ratio", job_id="job-a", rank="1", node="node-a") == 0.5
    assert value(m, "hangwatch_rank_step", job_id="job-a", rank="0", node="node-a") == 30.0
    assert m.get("hangwatch_rank_step", []) == [({"job_id": "job-a", "rank": "0", "node": "node-a"}, 30.0)]
    assert value(m, "hangwatch_rank_alive", job_id="job-a", rank="1", node="node-a") == 1.0
    assert value(m, "hangwatch_agent_last_report_timestamp_seconds", node="node-a") == pytest.approx(clock.now - 20)
    assert value(m, "hangwatch_rank_culprit", job_id="job-a", rank="1", node="node-a") == 1.0
    assert value(m, "hangwatch_rank_culprit", job_id="job-a", rank="0", node="node-a") == 0.0
    assert value(m, "hangwatch_agent_collector_up", node="node-a", collector="proc") == 1.0
    assert value(m, "hangwatch_agent_collector_up", node="node-a", collector="stacks") == 0.0
    assert value(m, "hangwatch_reports_total") == 1.0
    assert value(m, "hangwatch_reports_rejected_total", reason="invalid_json") == 1.0
    assert value(m, "hangwatch_reports_rejected_total", reason="too_large") == 0.0

    for samples in m.values():
        for labels, _ in samples:
            assert "pid" not in labels
            # "outcome": what became of an evidence capture's part (and an action, with "rule").
            assert set(labels) <= {"job_id", "verdict", "rank", "node", "collector", "reason", "state", "kind",
                                   "version", "python_version", "python_implementation", "le", "outcome", "rule",
                                   *JOB_INFO_LABELS}


def test_agents_own_cpu_and_memory_per_node(client: TestClient, clock: FakeClock) -> None:
    agent = {"version": "0.1.0", "pid": 42, "py_spy": "ok", "cpu_percent": 12.5, "rss_bytes": 50_000_000}
    client.post("/api/v1/reports", json=report(node="node-a", agent=agent, sent_at=clock.now))
    # An older agent says nothing of its own use: no series rather than a made-up 0.
    client.post("/api/v1/reports", json=report(node="node-b", ranks=[rank(rank=1)], sent_at=clock.now))
    m = scrape(client)
    assert value(m, "hangwatch_agent_cpu_ratio", node="node-a") == 0.125
    assert value(m, "hangwatch_agent_memory_bytes", node="node-a") == 50_000_000.0
    assert [labels for labels, _ in m["hangwatch_agent_cpu_ratio"]] == [{"node": "node-a"}]
    assert [labels for labels, _ in m["hangwatch_agent_memory_bytes"]] == [{"node": "node-a"}]
    # The next report's figures replace these.
    client.post("/api/v1/reports", json=report(node="node-a", agent={**agent, "cpu_percent": 3.0}, sent_at=clock.now))
    assert value(scrape(client), "hangwatch_agent_cpu_ratio", node="node-a") == 0.03


def test_ended_jobs_drop_out_after_the_retention_silent_nodes_stay(client: TestClient, clock: FakeClock) -> None:
    done = rank(job_id="done", world_size=1, alive=False, exit={"at": clock.now, "code": 0, "source": "proc"})
    client.post("/api/v1/reports", json=report(ranks=[done], sent_at=clock.now))
    reported_at = clock.now
    m = scrape(client)
    assert sum(v for labels, v in m["hangwatch_job_verdict"] if labels["job_id"] == "done") == 1.0
    clock.advance(601)  # job_retention_s defaults to 600
    m = scrape(client)
    assert "hangwatch_job_verdict" not in m
    assert client.get("/diagnose", params={"format": "json"}).json()["jobs"] == []
    # The silent node is still there, its last report time frozen: HangwatchAgentSilent holds.
    assert value(m, "hangwatch_agent_last_report_timestamp_seconds", node="node-a") == reported_at
    clock.advance(SILENT_NODE_KEPT_S)
    assert "hangwatch_agent_last_report_timestamp_seconds" not in scrape(client)


def test_build_info_and_process_metrics(client: TestClient) -> None:
    m = scrape(client)
    ((build, one),) = m["hangwatch_build_info"]
    assert one == 1.0 and build == {"version": version(), "python_version": platform.python_version(),
                                    "python_implementation": platform.python_implementation()}
    # The monitor's own process, read from /proc as prometheus_client's ProcessCollector does.
    assert value(m, "process_resident_memory_bytes") > 10_000_000
    assert value(m, "process_cpu_seconds_total") > 0
    assert value(m, "process_open_fds") >= 3 and value(m, "process_max_fds") >= value(m, "process_open_fds")
    started = psutil.Process().create_time()
    assert value(m, "process_start_time_seconds") == pytest.approx(started, abs=1.0)


def test_metrics_with_no_jobs(client: TestClient) -> None:
    m = scrape(client)
    assert value(m, "hangwatch_reports_total") == 0.0
    assert "hangwatch_job_verdict" not in m


def test_collective_wait_ratio_per_rank(client: TestClient, clock: FakeClock) -> None:
    compute = [frame("forward", "/work/model.py", 20), frame("train_step", "/work/train.py", 48)]
    for i in range(5):
        waiting = stack(clock.now, active=False)
        computing = stack(clock.now, frames=compute, active=True)
        ranks = [rank(rank=0, stack=waiting), rank(rank=1, stack=computing if i % 2 else waiting), rank(rank=2)]
        client.post("/api/v1/reports", json=report(ranks=ranks, sent_at=clock.now))
        clock.advance(1)
    m = scrape(client)
    assert value(m, "hangwatch_rank_collective_wait_ratio", job_id="job-a", rank="0", node="node-a") == 1.0
    assert value(m, "hangwatch_rank_collective_wait_ratio", job_id="job-a", rank="1",
                 node="node-a") == pytest.approx(0.6)
    # No stacks, no ratio.
    assert not [lab for lab, _ in m["hangwatch_rank_collective_wait_ratio"] if lab["rank"] == "2"]


def test_rank_state_culprit_and_agent_error_series(client, clock) -> None:
    bad = report(ranks=[rank(rank=0, stack_error="py-spy: Permission denied"), rank(rank=1)], sent_at=clock.now)
    bad["collectors"] = [{"name": "stacks", "ok": False, "error": "py-spy: Permission denied"}]
    for _ in range(3):
        assert client.post("/api/v1/reports", json=bad).status_code == 202
    m = scrape(client)
    states = [(labels["rank"], labels["state"]) for labels, v in m["hangwatch_rank_state"] if v == 1.0]
    assert sorted(r for r, _ in states) == ["0", "1"]  # exactly one current state per rank
    assert {labels["rank"] for labels, _ in m["hangwatch_rank_culprit"]} == {"0", "1"}
    assert value(m, "hangwatch_agent_collector_errors_total", node="node-a", collector="stacks") == 3.0
    assert value(m, "hangwatch_agent_stack_dump_failures_total", node="node-a") == 3.0


def test_process_families_read_the_proc_tree_they_are_given(tmp_path) -> None:
    """No /proc (another OS, a locked-down container): no process_* families, never a failed scrape."""
    assert process_families(proc=str(tmp_path)) == []
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    (tmp_path / "self").mkdir()
    fields = ["S"] + ["0"] * 50
    fields[11], fields[12], fields[19], fields[20], fields[21] = "250", "150", "1000", "4096", "10"
    (tmp_path / "self" / "stat").write_text("42 (uvicorn) " + " ".join(fields) + "\n")
    got = {f.name: f.lines for f in process_families(proc=str(tmp_path))}
    ticks = os.sysconf("SC_CLK_TCK")
    assert got["process_cpu_seconds"] == [f"process_cpu_seconds_total {400 / ticks!r}"]
    assert got["process_start_time_seconds"] == [f"process_start_time_seconds {1700000000 + 1000 / ticks!r}"]
    assert got["process_virtual_memory_bytes"] == ["process_virtual_memory_bytes 4096.0"]


def test_job_info_carries_the_names_people_know_the_job_by(client: TestClient, clock: FakeClock) -> None:
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "llama"}
    pod = {"POD_NAME": "w-0", "POD_NAMESPACE": "ml", "TORCHELASTIC_RUN_ID": "run-7"}
    client.post("/api/v1/reports", json=report(ranks=[rank(job_id="10.0.0.1:29500", env=slurm),
                                                      rank(job_id="10.0.0.2:29500", env=pod)], sent_at=clock.now))
    samples = scrape(client)
    assert value(samples, "hangwatch_job_info", job_id="10.0.0.1:29500", slurm_job="4242.0", slurm_job_name="llama",
                 k8s_namespace="", torchelastic_run_id="", display="slurm job 4242.0 (llama)") == 1.0
    assert value(samples, "hangwatch_job_info", job_id="10.0.0.2:29500", slurm_job="", slurm_job_name="",
                 k8s_namespace="ml", torchelastic_run_id="run-7", display="pod ml/w-0") == 1.0
