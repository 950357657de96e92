"""A job of hundreds of ranks through the real monitor: small default answers, every rank a page away,
and the bookkeeping that keeps a report's cost independent of its job's size."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from monitor_reports import frame, launcher, progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient, monitor_of, post_report

from monitor.present.job_answer import RANKS_LISTED_BY_DEFAULT
from monitor.present.render_text import LAUNCHERS_LISTED
from monitor.web.job_series import JobSeries

JOB = "10.0.0.1:29500"
NODES = 75
RANKS = NODES * 8
CULPRIT = 301
LINGER = [frame("main", "/work/train.py", 131), frame("<module>", "/work/train.py", 160)]


def _post_all(client: TestClient, clock: FakeClock) -> None:
    """Every node's report: all ranks idle in all_reduce but the culprit, idle in the user's code."""
    for node in range(NODES):
        ranks = [rank(job_id=JOB, rank=r, world_size=RANKS, pid=10_000 + r, cpu_percent=0.5,
                      stack=stack(clock.now - 0.5, frames=LINGER if r == CULPRIT else None))
                 for r in range(node * 8, node * 8 + 8)]
        post_report(client, report(node=f"node-{node:03d}", ranks=ranks, sent_at=clock.now))


@pytest.fixture
def giant(client: TestClient, clock: FakeClock) -> TestClient:
    _post_all(client, clock)
    clock.advance(12)  # idle past the 10 s a job without progress lines may sit parked
    _post_all(client, clock)
    return client


def _job(client: TestClient, **params: Any) -> dict[str, Any]:
    response = client.get("/diagnose", params={"format": "json", "job": JOB, **params})
    assert response.status_code == 200, response.text
    [job] = response.json()["jobs"]
    return job


def test_the_default_answer_lists_the_culprit_first_and_a_bounded_number_of_ranks(giant: TestClient) -> None:
    job = _job(giant)
    assert job["verdict"] == "deadlock" and job["culprit_ranks"] == [CULPRIT]
    assert job["ranks_total"] == RANKS and job["ranks_offset"] == 0
    listed = [r["rank"] for r in job["ranks"]]
    assert len(listed) == RANKS_LISTED_BY_DEFAULT
    assert listed[0] == CULPRIT and listed[1:] == [r for r in range(RANKS) if r != CULPRIT][:len(listed) - 1]
    assert job["ranks"][0]["state"] == "idle"
    # Grouped, not a line per rank.
    assert len(job["evidence"]) < 10
    assert job["groups"] == [{"site": "all_reduce@train.py:50", "ranks": [r for r in range(RANKS) if r != CULPRIT]}]


def test_pages_of_ranks_cover_every_rank_once_in_rank_order(giant: TestClient) -> None:
    seen: list[int] = []
    offset = 0
    while True:
        page = _job(giant, ranks_offset=offset, ranks_limit=250)
        assert page["ranks_total"] == RANKS and page["ranks_offset"] == offset
        if not page["ranks"]:
            break
        seen += [r["rank"] for r in page["ranks"]]
        offset += 250
    assert seen == list(range(RANKS))


def test_the_text_answer_says_how_many_ranks_it_does_not_list(giant: TestClient) -> None:
    response = giant.get("/diagnose", params={"job": JOB})
    assert response.status_code == 200
    text = response.text
    # The nodes as a count and a range, not 75 names on one line (issue 37).
    assert f"world size {RANKS}, {RANKS} ranks seen on {NODES} nodes: node-[000-{NODES - 1:03d}]\n" in text
    assert f"... {RANKS - RANKS_LISTED_BY_DEFAULT} more ranks not listed" in text
    assert len(text.splitlines()) < RANKS_LISTED_BY_DEFAULT + 60


def test_a_small_job_still_lists_every_rank(client: TestClient, clock: FakeClock) -> None:
    post_report(client, report(ranks=[rank(job_id="small", rank=r, world_size=4) for r in range(4)], sent_at=clock.now))
    response = client.get("/diagnose", params={"format": "json", "job": "small"})
    [small] = response.json()["jobs"]
    assert [r["rank"] for r in small["ranks"]] == [0, 1, 2, 3] and small["ranks_total"] == 4


@pytest.mark.parametrize(("params", "status"), [
    ({"ranks_offset": -1}, 422),
    ({"ranks_limit": 0}, 422),
    ({"ranks_limit": "many"}, 422),
])
def test_bad_rank_pages_are_refused(client: TestClient, params: dict, status: int) -> None:
    assert client.get("/diagnose", params={"format": "json", **params}).status_code == status


# --- what ingest keeps so that no report walks the job's ranks ---


def test_running_and_sleeping_do_not_force_a_pass_but_a_stop_does(client: TestClient, clock: FakeClock) -> None:
    post_report(client, report(ranks=[rank(job_id="j", rank=0, state="R")], sent_at=clock.now))
    job = monitor_of(client)._state.jobs["j"]
    revision = job.lifecycle_revision
    for state in ("S", "R", "D", "S"):
        clock.advance(1)
        post_report(client, report(ranks=[rank(job_id="j", rank=0, state=state)], sent_at=clock.now))
    assert job.lifecycle_revision == revision
    clock.advance(1)
    post_report(client, report(ranks=[rank(job_id="j", rank=0, state="T")], sent_at=clock.now))
    assert job.lifecycle_revision == revision + 1


def test_the_jobs_newest_progress_is_kept_as_reports_come(client: TestClient, clock: FakeClock) -> None:
    t = clock.now
    post_report(client, report(ranks=[
        rank(job_id="j", rank=0, progress=progress(3, 3, [(t - 3, 1), (t - 2, 2), (t - 1, 3)])),
        rank(job_id="j", rank=1, progress=progress(2, 2, [(t - 5, 1), (t - 4, 2)])),
    ], sent_at=t))
    job = monitor_of(client)._state.jobs["j"]
    assert job.last_progress_at == pytest.approx(t - 1)
    assert job.last_progress_at == max(r.last_progress_at for r in job.ranks.values())


def test_a_wait_site_is_learned_once_the_job_progresses_past_its_stack(client: TestClient, clock: FakeClock) -> None:
    t = clock.now
    post_report(client, report(ranks=[rank(job_id="j", rank=0, stack=stack(t - 1),
                                            progress=progress(1, 1, [(t - 2, 1)]))], sent_at=t))
    job = monitor_of(client)._state.jobs["j"]
    assert job.known_wait_sites == set() and job.pending_wait_ranks == {0}
    clock.advance(1)
    post_report(client, report(ranks=[rank(job_id="j", rank=0, stack=stack(t - 1),
                                            progress=progress(2, 2, [(t - 2, 1), (t + 0.5, 2)]))], sent_at=clock.now))
    assert job.known_wait_sites == {"all_reduce@train.py:50"} and job.pending_wait_ranks == set()


def test_a_stalled_jobs_waiting_ranks_are_not_walked_as_its_progress_creeps(client: TestClient,
                                                                             clock: FakeClock) -> None:
    """After a restart each node's full report moves the job's progress a little, before every stack:
    only ranks whose stack was taken before the progress are looked at, and a stalled job's new stacks
    keep one entry per waiting rank."""
    t = clock.now
    waiting = [rank(job_id="j", rank=r, world_size=66, stack=stack(t - 0.5)) for r in range(64)]
    post_report(client, report(ranks=waiting, sent_at=t))
    job = monitor_of(client)._state.jobs["j"]
    for k in range(20):  # progress creeps up to just before the stacks; new stacks keep coming
        clock.advance(1)
        post_report(client, report(node="node-b", ranks=[rank(job_id="j", rank=64 + k % 2, world_size=66, progress=progress(
            k + 1, k + 1, [(t - 5 + k * 0.2, k + 1)]))], sent_at=clock.now))
        post_report(client, report(ranks=[rank(job_id="j", rank=r, world_size=66, stack=stack(clock.now - 0.5))
                                          for r in range(64)], sent_at=clock.now))
    assert job.known_wait_sites == set() and len(job.pending_wait_ranks) == 64
    assert len(job.pending_wait_heap) <= 4 * 64 + 64
    # The job steps past the stacks: every waiting rank's site is learned.
    clock.advance(2)
    post_report(client, report(node="node-b", ranks=[rank(job_id="j", rank=64, world_size=66, progress=progress(
        30, 30, [(clock.now - 0.1, 30)]))], sent_at=clock.now))
    assert job.known_wait_sites == {"all_reduce@train.py:50"} and job.pending_wait_ranks == set()


def test_metrics_count_a_giant_jobs_ranks_by_state_and_keep_per_rank_series_for_its_culprits(
        giant: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def series(text: str, name: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(name + "{") and f'job_id="{JOB}"' in line]

    full = giant.get("/metrics").text
    assert len(series(full, "hangwatch_rank_alive")) == RANKS  # under the cap: every rank
    monkeypatch.setattr("monitor.web.job_series.RANK_SERIES_MAX_RANKS", RANKS - 1)
    # The job's text is kept while its result stands (monitor/web/job_series.py): it was written under the old cap.
    monkeypatch.setattr(giant.app.state, "job_series", JobSeries())
    capped = giant.get("/metrics").text
    assert series(capped, "hangwatch_rank_alive") == [
        f'hangwatch_rank_alive{{job_id="{JOB}",rank="{CULPRIT}",node="node-{CULPRIT // 8:03d}"}} 1.0']
    assert f'hangwatch_rank_culprit{{job_id="{JOB}",rank="{CULPRIT}",node="node-{CULPRIT // 8:03d}"}} 1.0' in capped
    counts = {line.split('state="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
              for line in series(capped, "hangwatch_job_ranks")}
    assert counts["in_collective"] == RANKS - 1 and counts["idle"] == 1 and sum(counts.values()) == RANKS
    assert len(capped) < len(full) / 10


def test_the_background_pass_diagnoses_a_giant_job_off_the_lock_and_keeps_the_result(
        giant: TestClient, clock: FakeClock) -> None:
    from monitor.engine.service import Offload

    monitor = monitor_of(giant)
    steps = list(monitor.tick_steps(clock.now))
    offloads = [s for s in steps if isinstance(s, Offload)]
    assert len(offloads) == 1  # the one job over VIEW_CHUNK ranks; tick_steps' caller runs it
    assert monitor.history(JOB) == []  # nothing stored: the offloaded work was not run
    # tick() runs the offloaded work itself: the pass records the verdict and its culprit.
    clock.advance(1)
    monitor.tick(clock.now)
    [change] = monitor.history(JOB)
    assert (change.verdict, change.culprit_ranks, change.at) == ("deadlock", (CULPRIT,), clock.now)


def test_a_watched_giant_job_is_rendered_ahead_of_its_reads(giant: TestClient, clock: FakeClock,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import monitor.present.answers as answers

    monitor = monitor_of(giant)
    monitor.settings = dataclasses.replace(monitor.settings, tick_interval_s=1.0)  # reads answer from the passes
    monitor.tick()
    renders: list[float] = []
    render = answers.job_dict
    monkeypatch.setattr(answers, "job_dict", lambda *a, **k: renders.append(clock.now) or render(*a, **k))
    assert _job(giant)["verdict"] == "deadlock" and len(renders) == 1  # the job is watched from here on
    clock.advance(1)
    _post_all(giant, clock)
    monitor.tick()  # a giant job's pass: its rules, then its answer, on the worker thread's side
    assert len(renders) == 2
    job = _job(giant)
    assert len(renders) == 2 and job["last_report_at"] == clock.now and job["culprit_ranks"] == [CULPRIT]
    # Nobody asked for WATCHED_S: the passes stop rendering it.
    clock.advance(answers.WATCHED_S + 1)
    _post_all(giant, clock)
    monitor.tick()
    assert len(renders) == 2
    assert _job(giant)["last_report_at"] == clock.now and len(renders) == 3


def _published_not_rendered(giant: TestClient, clock: FakeClock) -> tuple[float, Iterator[Any], Any]:
    """A watched giant job's next pass, stopped between its rules (run: the diagnosis is published)
    and its render-ahead (returned, not run): the answer's ``last_report_at`` before, the pass's
    remaining steps, and the render-ahead step."""
    from monitor.engine.service import Offload

    monitor = monitor_of(giant)
    monitor.settings = dataclasses.replace(monitor.settings, tick_interval_s=1.0)  # reads answer from the passes
    monitor.tick()
    before = _job(giant)["last_report_at"]  # watched from here on
    clock.advance(1)
    _post_all(giant, clock)
    steps = monitor.tick_steps()
    next(step for step in steps if isinstance(step, Offload)).run()  # the job's rules...
    rendering = next(step for step in steps if isinstance(step, Offload))  # ...then its answer, not run yet
    return before, steps, rendering


def test_reads_get_the_previous_answer_while_the_new_one_is_rendered_ahead(
        giant: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a second rendering of every rank beside the render-ahead (two renders on a busy monitor
    slowed each other to 100-450 ms a read), and never an answer older than the pass before."""
    import monitor.present.answers as answers

    renders: list[float] = []
    render = answers.job_dict
    monkeypatch.setattr(answers, "job_dict", lambda *a, **k: renders.append(clock.now) or render(*a, **k))
    before, steps, rendering = _published_not_rendered(giant, clock)
    assert len(renders) == 1
    assert _job(giant)["last_report_at"] == before and len(renders) == 1  # the previous answer, not a render
    rendering.run()
    assert len(renders) == 2
    assert _job(giant)["last_report_at"] == clock.now and len(renders) == 2
    list(steps)  # the pass ends


def test_a_failed_render_ahead_leaves_reads_to_render(giant: TestClient, clock: FakeClock,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import monitor.present.answers as answers

    _, steps, rendering = _published_not_rendered(giant, clock)
    render = answers.job_dict
    monkeypatch.setattr(answers, "job_dict", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        rendering.run()
    monkeypatch.setattr(answers, "job_dict", render)
    assert _job(giant)["last_report_at"] == clock.now  # rendered by the read itself
    list(steps)


def _post_launchers(client: TestClient, clock: FakeClock, nodes: int) -> None:
    """A torchrun per node, 2 workers each but node 7's, which has 1."""
    for node in range(nodes):
        workers = [20_000 + node * 2] if node == 7 else [20_000 + node * 2, 20_001 + node * 2]
        post_report(client, report(node=f"node-{node:03d}", sent_at=clock.now, ranks=[], launchers=[
            launcher(job_id="wide", pid=900 + node, nnodes=str(nodes), node_rank=node, worker_pids=workers)]))


def test_a_launcher_per_node_is_listed_for_a_few_and_counted_for_the_rest(client: TestClient, clock: FakeClock) -> None:
    _post_launchers(client, clock, 40)
    text = client.get("/diagnose", params={"job": "wide"}).text
    lines = text[text.index("launchers"):].split("\n\n")[0].splitlines()[1:]
    assert len(lines) == LAUNCHERS_LISTED + 1, text
    assert "node-007 pid 907, node 7 of 40, 1 workers, alive" in lines[0]  # the unusual one first
    assert lines[-1].strip() == "... 32 more, alive, 2 workers each, on 32 nodes: node-[008-039]"
