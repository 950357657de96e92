"""Fail-slow through the monitor's real ingest (FastAPI app, a hand-moved clock): the agent's new fields (denied
CPU, tcp_info, GPU clocks) and the job's progress reach the pace, the levels, the verdict, the JSON answer and
/metrics. The end-to-end runs with real jobs are tests/e2e/test_fail_slow.py."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.monitor.monitor_reports import progress, rank, report, stack
from tests.monitor.monitor_testkit import FakeClock, TestClient, job_answer, post_report

COMPUTE = [{"name": "heavy", "file": "/work/train.py", "line": 70}, {"name": "main", "file": "/work/train.py", "line": 9}]


def tcp(rtt: float, low: float, retrans: float = 0.0) -> dict:
    return {"rtt_ms": rtt, "min_rtt_ms": low, "retrans_per_s": retrans, "total_retrans": 0}


def run(client: TestClient, clock: FakeClock, seconds: int, events_per_s: float, **per_rank) -> None:
    """``seconds`` of reports, one a second from each of two nodes (a rank each), the log advancing: its
    running count of progress lines is kept on the clock, which each test has its own of."""
    counts = clock.__dict__.setdefault("progress_lines", {})
    for _ in range(seconds):
        now = clock()
        for r, node in enumerate(("node-a", "node-b")):
            count = counts[r] = counts.get(r, 0) + events_per_s
            fields = {k: (v(r, now) if callable(v) else v) for k, v in per_rank.items()}
            entry = rank(rank=r, progress=progress(int(count), int(count), [(now, int(count))]), **fields)
            post_report(client, report(node=node, ranks=[entry], sent_at=now,
                                       host={"interfaces": [{"name": "eth0", "addresses": [f"10.0.0.{10 + r}/24"]}]}))
        clock.advance(1.0)


def test_a_squeezed_rank_is_named_by_its_run_queue_through_ingest(client: TestClient, clock: FakeClock) -> None:
    computing = {"state": "R", "stack": lambda r, now: stack(now - 0.5, COMPUTE, active=True)}
    run(client, clock, 25, 5.0, cpu_percent=60.0, sched={"run_queue_wait_percent": 2.0}, **computing)
    # Squeezed: rank 1 waits for a core 70% of the time; rank 0, waiting for rank 1 in each collective,
    # shows more CPU; the job steps at 2/5 of its pace.
    run(client, clock, 40, 2.0, cpu_percent=lambda r, now: 25.0 if r else 40.0, state="R",
        sched=lambda r, now: {"run_queue_wait_percent": 70.0 if r else 2.0, "cpu_throttled_percent": 0.0,
                              "cgroup": "/system.slice/train.service"},
        stack=lambda r, now: stack(now - 0.5, COMPUTE, active=True))
    job = job_answer(client, "job-a")
    assert (job["verdict"], job["culprit_ranks"]) == ("straggler", [1]), job["summary"]
    assert "waited in the run queue for a CPU 70% of the time" in " ".join(job["evidence"])
    assert [r["run_queue_wait_percent"] for r in job["ranks"]] == [2.0, 70.0]
    assert 2 < job["pace"]["ratio"] < 3 and job["pace"]["baseline_s"] > 0


def test_a_job_falling_to_a_fraction_of_its_pace_on_slow_links_is_slow_network(client: TestClient,
                                                                                 clock: FakeClock) -> None:
    parked = {"cpu_percent": 3.0, "stack": lambda r, now: stack(now - 0.5)}  # in all_reduce
    run(client, clock, 30, 6.0, **parked,
        sockets=lambda r, now: [{"local": f"10.0.0.{10 + r}:4100{r}", "remote": f"10.0.0.{11 - r}:4100{1 - r}",
                                 "state": "ESTABLISHED", "tx_queue": 0, "tcp": tcp(0.2, 0.05)}])
    assert job_answer(client, "job-a")["verdict"] == "healthy"
    run(client, clock, 40, 0.08, **parked,
        sockets=lambda r, now: [{"local": f"10.0.0.{10 + r}:4100{r}", "remote": f"10.0.0.{11 - r}:4100{1 - r}",
                                 "state": "ESTABLISHED", "tx_queue": 800_000, "tcp": tcp(240.0, 0.05, 2.0)}])
    job = job_answer(client, "job-a")
    assert job["verdict"] == "slow_network", job["summary"]
    assert "node-a <-> node-b" in job["summary"] and job["pace"]["ratio"] >= 3
    assert any("round trip 240.0 ms against 0.05 ms" in e for e in job["evidence"]), job["evidence"]
    scrape = {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text)
              for s in f.samples if s.labels.get("job_id") == "job-a"}
    assert scrape["hangwatch_job_pace_ratio"] >= 3 and scrape["hangwatch_job_goodput_ratio"] < 1


def test_a_gpu_held_down_by_nvml_reaches_the_verdict(client: TestClient, clock: FakeClock) -> None:
    run(client, clock, 40, 5.0, cpu_percent=100.0, state="R",
        stack=lambda r, now: stack(now - 0.5, COMPUTE, active=True),
        gpus=lambda r, now: [{"index": 0, "utilization_percent": 99.0, "sm_clock_mhz": 1050 if r else 1980,
                              "max_sm_clock_mhz": 1980, "clock_event_reasons": ["hw_slowdown"] if r else []}])
    job = job_answer(client, "job-a")
    assert (job["verdict"], job["culprit_ranks"]) == ("straggler", [1]), job["summary"]
    assert "held down to 1050 MHz" in job["summary"]


def test_forged_fail_slow_fields_are_refused_and_change_nothing(client: TestClient, clock: FakeClock) -> None:
    for bad in ({"sched": {"run_queue_wait_percent": -5}}, {"sched": {"cgroup": "/a\nb"}},
                {"gpus": [{"index": 0, "clock_event_reasons": ["rm -rf /"]}]},
                {"sockets": [{"local": "a", "remote": "b", "state": "ESTABLISHED", "tcp": {"rtt_ms": 1e300}}]}):
        answer = client.post("/api/v1/reports", json=report(ranks=[rank(**bad)], sent_at=clock()))
        assert answer.status_code == 422, bad
    assert client.get("/diagnose?format=json").json()["jobs"] == []
