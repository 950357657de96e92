"""The per-job families of /metrics written as text (monitor/web/job_series.py), and the text kept per result."""

from __future__ import annotations

import weakref

import pytest
from monitor_reports import progress, rank, report
from monitor_testkit import FakeClock, TestClient
from prometheus_client.parser import text_string_to_metric_families

from monitor.diagnosis import Diagnosis, JobView, RankView
from monitor.diagnosis.model import PaceView, RankDiagnosis
from monitor.engine.published import JobResult
from monitor.web.exposition import Family, render
from monitor.web.job_series import JOB_FAMILIES, RANK_STATES, JobSeries, job_chunks

NOW = 1_700_000_000.0


def result(job_id: str = "job-a", states: dict[int, str] | None = None, culprits: tuple[int, ...] = (),
           node: str = "node-a", verdict: str = "healthy", **rank_fields: object) -> JobResult:
    """A published result of one job whose ranks are ``states``' keys, each in its state (absent: no
    RankDiagnosis, i.e. unknown), all on ``node``, with ``rank_fields`` on every rank."""
    states = {0: "running"} if states is None else states
    ranks = tuple(RankView(rank=r, node=node, pid=100 + r, alive=True, observed_at=NOW, first_seen_at=NOW - 60,
                           **rank_fields) for r in sorted(states))  # type: ignore[arg-type]
    view = JobView(job_id=job_id, world_size=len(ranks), now=NOW, first_seen_at=NOW - 60, ranks=ranks,
                   pace=PaceView(baseline_s=0.5, now_s=1.0, ratio=2.0, goodput=0.75))
    found = Diagnosis(verdict, culprits, None, "", ranks=tuple(RankDiagnosis(r, s) for r, s in states.items() if s))
    return JobResult(view=view, diagnosis=found, last_report_at=NOW, last_progress_at=NOW - 5,
                     cpu_seconds={r: 10.0 * r for r in states}, lost_rank_seconds={"deadlock": 30.0})


def scraped(*results: JobResult) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The results' families as a scraper parses them: sample name -> (labels, value)."""
    families = [Family(name, help_text, kind) for name, help_text, kind in JOB_FAMILIES]
    for chunks in (job_chunks(r) for r in results):
        for family, chunk in zip(families, chunks):
            if chunk:
                family.lines.append(chunk)
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(render(families).decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


@pytest.mark.parametrize("state", [*RANK_STATES, None, "no_such_state"])
def test_each_rank_is_1_in_its_own_state_only(state: str | None) -> None:
    """None: the diagnosis lists no state for the rank (unknown); a word outside RANK_STATES is 0 everywhere."""
    m = scraped(result(states={0: "running", 7: state}))  # type: ignore[dict-item]
    rank7 = {labels["state"]: v for labels, v in m["hangwatch_rank_state"] if labels["rank"] == "7"}
    assert set(rank7) == set(RANK_STATES)
    shown = "unknown" if state is None else state
    assert {s for s, v in rank7.items() if v == 1.0} == ({shown} if shown in RANK_STATES else set())
    counts = {labels["state"]: v for labels, v in m["hangwatch_job_ranks"]}
    # Counted from the diagnosis's ranks, by the states series exist for.
    assert sum(counts.values()) == 1 + (state in RANK_STATES)


@pytest.mark.parametrize("odd", ['quo"te', "back\\slash", "new\nline", "nul\x00byte", "ünïcode", "a,b={c}"])
def test_odd_job_ids_and_node_names_read_back_as_they_are(odd: str) -> None:
    m = scraped(result(job_id=f"job-{odd}", node=f"node-{odd}", states={0: "idle", 1: "running"}))
    for name in ("hangwatch_rank_state", "hangwatch_rank_culprit", "hangwatch_rank_alive",
                 "hangwatch_rank_cpu_seconds_total"):
        assert {(labels["job_id"], labels["node"]) for labels, _ in m[name]} == {(f"job-{odd}", f"node-{odd}")}
    assert [v for labels, v in m["hangwatch_rank_state"] if labels["state"] == "idle" and labels["rank"] == "0"] == [1.0]
    assert [labels["job_id"] for labels, _ in m["hangwatch_job_verdict"]][0] == f"job-{odd}"


@pytest.mark.parametrize(("fields", "name", "expected"), [
    ({}, "hangwatch_rank_cpu_seconds_total", 10.0),  # rank 1's cpu_seconds
    ({"cpu_percent": 150.0}, "hangwatch_rank_cpu_ratio", 1.5),
    ({"cpu_percent": None}, "hangwatch_rank_cpu_ratio", None),
    ({"step": 42}, "hangwatch_rank_step", 42.0),
    ({"step": None}, "hangwatch_rank_step", None),
    ({"progress_times": (NOW - 3, NOW - 2)}, "hangwatch_rank_last_progress_timestamp_seconds", NOW - 2),
    ({}, "hangwatch_rank_last_progress_timestamp_seconds", None),  # neither its own nor the job's progress
    ({"collective_wait_share": 0.25}, "hangwatch_rank_collective_wait_ratio", 0.25),
    ({"alive": False}, "hangwatch_rank_alive", 0.0),
    ({}, "hangwatch_rank_alive", 1.0),
])
def test_per_rank_values(fields: dict, name: str, expected: float | None) -> None:
    job = result(states={1: "running"})
    rank1 = job.view.ranks[0]
    job = JobResult(view=JobView(**{**job.view.__dict__, "ranks": (RankView(**{**rank1.__dict__, **fields}),)}),
                    diagnosis=job.diagnosis, last_report_at=NOW, last_progress_at=None, cpu_seconds=job.cpu_seconds)
    values = [v for labels, v in scraped(job).get(name, [])]
    assert values == ([] if expected is None else [expected])


def test_job_families() -> None:
    m = scraped(result(verdict="deadlock", culprits=(1,), states={0: "in_collective", 1: "idle"}))
    assert {labels["verdict"]: v for labels, v in m["hangwatch_job_verdict"]}["deadlock"] == 1.0
    assert sum(v for _, v in m["hangwatch_job_verdict"]) == 1.0
    assert m["hangwatch_job_culprit_ranks"] == [({"job_id": "job-a"}, 1.0)]
    assert m["hangwatch_job_world_size"] == [({"job_id": "job-a"}, 2.0)]
    assert m["hangwatch_job_last_progress_timestamp_seconds"] == [({"job_id": "job-a"}, NOW - 5)]
    assert m["hangwatch_job_lost_rank_seconds_total"] == [({"job_id": "job-a", "verdict": "deadlock"}, 30.0)]
    assert m["hangwatch_job_pace_ratio"] == [({"job_id": "job-a"}, 2.0)]
    assert m["hangwatch_job_goodput_ratio"] == [({"job_id": "job-a"}, 0.75)]
    assert sorted(m["hangwatch_job_progress_interval_seconds"], key=lambda s: s[1]) == [
        ({"job_id": "job-a", "pace": "baseline"}, 0.5), ({"job_id": "job-a", "pace": "now"}, 1.0)]
    assert {labels["rank"]: v for labels, v in m["hangwatch_rank_culprit"]} == {"0": 0.0, "1": 1.0}
    assert "hangwatch_job_lost_gpu_seconds_total" not in m  # no GPU-seconds lost: no series


def test_a_giant_job_keeps_per_rank_series_for_its_culprits_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("monitor.web.job_series.RANK_SERIES_MAX_RANKS", 3)
    small = result(job_id="small", states=dict.fromkeys(range(3), "running"))
    giant = result(job_id="giant", states=dict.fromkeys(range(4), "in_collective") | {2: "idle"}, culprits=(2,))
    m = scraped(small, giant)
    for name in ("hangwatch_rank_alive", "hangwatch_rank_culprit", "hangwatch_rank_cpu_seconds_total"):
        assert sorted((labels["job_id"], labels["rank"]) for labels, _ in m[name]) == [
            ("giant", "2"), ("small", "0"), ("small", "1"), ("small", "2")]
    counts = {labels["state"]: v for labels, v in m["hangwatch_job_ranks"] if labels["job_id"] == "giant"}
    assert counts["in_collective"] == 3.0 and counts["idle"] == 1.0


def test_the_text_is_kept_while_the_result_stands() -> None:
    series = JobSeries()
    a, b = result(job_id="a"), result(job_id="b")
    first_a, first_b = series.chunks([a, b])
    again_a, again_b = series.chunks([b, a])[::-1]
    assert again_a is first_a and again_b is first_b  # the same results: not written again
    renewed = result(job_id="a", verdict="deadlock", culprits=(0,))
    [new_a] = series.chunks([renewed])
    assert new_a is not first_a and new_a == job_chunks(renewed) and 'verdict="deadlock"} 1.0' in new_a[0]
    # "b" was not among the last results: it is let go, and written again when it comes back.
    [back_b] = series.chunks([b])
    assert back_b is not first_b and back_b == first_b


def test_a_replaced_result_is_not_held_by_the_kept_text() -> None:
    series = JobSeries()
    old = result(job_id="a")
    series.chunks([old])
    freed = weakref.ref(old)
    del old  # the engine published a newer result: nothing else holds this one
    assert freed() is None
    [chunks] = series.chunks([result(job_id="a", verdict="deadlock")])
    assert 'verdict="deadlock"} 1.0' in chunks[0]


def test_a_scrape_after_new_reports_shows_them(client: TestClient, clock: FakeClock) -> None:
    """Through the route: the text kept from one scrape never hides what the next pass published."""
    def step_of_rank_0() -> float:
        for family in text_string_to_metric_families(client.get("/metrics").text):
            for s in family.samples:
                if s.name == "hangwatch_rank_step" and s.labels["rank"] == "0":
                    return s.value
        raise AssertionError("no hangwatch_rank_step for rank 0")

    for step in (10, 11):
        p = progress(step, step, [(clock.now - 0.5, step)])
        assert client.post("/api/v1/reports", json=report(ranks=[rank(rank=0, progress=p)],
                                                          sent_at=clock.now)).status_code == 202
        assert step_of_rank_0() == float(step)
        assert step_of_rank_0() == float(step)  # the second scrape of the same result, from the kept text
        clock.advance(1)
