"""Reports an agent kept through an outage: applied at the time they were taken, their verdicts in history."""

from __future__ import annotations

import dataclasses

from monitor_reports import progress, rank, report
from monitor_testkit import FakeClock, TestClient, monitor_of

from monitor.web.app import create_app
from monitor.web.settings import Settings
from monitor.storage.store import Store

URL = "/api/v1/reports"


def _ranks(clock: FakeClock, step: int, *, rank1_alive: bool = True) -> list[dict]:
    recent = [(clock.now - 0.5, step - 1), (clock.now, step)]
    second = rank(rank=1, progress=progress(step, step, recent)) if rank1_alive else rank(
        rank=1, alive=False, exit={"at": clock.now, "code": None, "signal": 9, "source": "proc"}, cpu_percent=None)
    return [rank(rank=0, progress=progress(step, step, recent)), second]


def _history(client: TestClient) -> list[tuple[float, str, list[int]]]:
    return [(h["at"], h["verdict"], h["culprit_ranks"]) for h in client.get("/api/v1/jobs/job-a/history").json()["history"]]


def test_a_rank_that_exited_during_an_outage_is_in_the_history_at_the_time_it_exited(
        client: TestClient, clock: FakeClock) -> None:
    start = clock.now
    for step in range(1, 4):
        assert client.post(URL, json=report(ranks=_ranks(clock, step), sent_at=clock.now)).status_code == 202
        monitor_of(client).tick()
        clock.advance(1)
    # The monitor is unreachable for 2 minutes; rank 1 is killed 10 s in. The agent keeps what changed.
    kept = []
    clock.advance(10)
    exited_at = clock.now
    kept.append(report(ranks=_ranks(clock, 4, rank1_alive=False), sent_at=clock.now, replayed=True))
    clock.advance(60)
    kept.append(report(ranks=_ranks(clock, 4, rank1_alive=False), sent_at=clock.now, replayed=True))
    clock.advance(60)
    for body in kept:
        answer = client.post(URL, json=body)
        assert answer.status_code == 202 and answer.json()["replay"] is True
    assert client.post(URL, json=report(ranks=_ranks(clock, 4, rank1_alive=False), sent_at=clock.now)).status_code == 202
    monitor_of(client).tick()

    history = _history(client)
    assert history[0][:2] == (start, "healthy")
    assert (exited_at, "rank_exited", [1]) in history
    assert [at for at, _, _ in history] == sorted(at for at, _, _ in history)
    assert client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]["verdict"] == "rank_exited"
    assert monitor_of(client).replayed_total == 2


def test_replayed_times_follow_the_nodes_clock_offset_and_never_go_back(client: TestClient, clock: FakeClock) -> None:
    skew = 100.0  # the node's clock runs 100 s ahead of the monitor's
    assert client.post(URL, json=report(ranks=_ranks(clock, 1), sent_at=clock.now + skew)).status_code == 202
    live_at = clock.now
    clock.advance(30)
    taken_at = clock.now
    kept = report(ranks=_ranks(clock, 2, rank1_alive=False), sent_at=clock.now + skew, replayed=True)
    clock.advance(30)
    assert client.post(URL, json=kept).status_code == 202
    assert (taken_at, "rank_exited", [1]) in _history(client)
    # A kept report older than what the monitor already applied lands at that time, not before it.
    stale = report(ranks=_ranks(clock, 1), sent_at=live_at - 50 + skew, replayed=True)
    assert client.post(URL, json=stale).status_code == 202
    assert all(at >= live_at for at, _, _ in _history(client))


def test_a_report_kept_too_long_is_not_applied(client: TestClient, clock: FakeClock) -> None:
    ancient = report(ranks=_ranks(clock, 1), sent_at=clock.now - 7200, replayed=True)
    assert client.post(URL, json=ancient).status_code == 202
    assert client.get("/diagnose", params={"format": "json"}).json()["jobs"] == []
    assert monitor_of(client).replayed_dropped == 1


def test_a_replayed_past_is_not_served_as_the_present(settings: Settings, store: Store, clock: FakeClock) -> None:
    # Reads answer from the background pass's results here, as in production (the tick is far off).
    ticking = dataclasses.replace(settings, tick_interval_s=3600.0)
    with TestClient(create_app(ticking, store, clock=clock)) as client:
        _replay_an_old_picture(client, clock)


def _replay_an_old_picture(client: TestClient, clock: FakeClock) -> None:
    assert client.post(URL, json=report(ranks=_ranks(clock, 1), sent_at=clock.now)).status_code == 202
    monitor_of(client).tick()
    clock.advance(120)  # an outage; the agent kept a report from its start, when all was well
    kept = report(ranks=_ranks(clock, 2), sent_at=clock.now - 110, replayed=True)
    assert client.post(URL, json=kept).status_code == 202
    job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
    # Now, the node has not reported live for 2 minutes: nothing is known, least of all "healthy".
    assert job["verdict"] == "unknown", job["summary"]


def test_a_replayed_report_taken_moments_ago_is_still_the_past(settings: Settings, store: Store,
                                                              clock: FakeClock) -> None:
    # A short outage: the agent's last kept report was taken 2 s before it reached the monitor, well
    # inside the window a live report counts as fresh. It shows both ranks busy and the last step 30 s
    # back (the job was failing as the outage ended). Read as the present that is slow_compute; it is
    # the past until the node's first live report says what is true now.
    ticking = dataclasses.replace(settings, tick_interval_s=3600.0)
    with TestClient(create_app(ticking, store, clock=clock)) as client:
        for step in range(1, 4):
            assert client.post(URL, json=report(ranks=_ranks(clock, step), sent_at=clock.now)).status_code == 202
            clock.advance(1)
        last_step_at = clock.now - 1
        clock.advance(30)
        stale = [(last_step_at - 0.5, 2), (last_step_at, 3)]
        busy = [rank(rank=r, cpu_percent=99.0, progress=progress(3, 3, stale)) for r in (0, 1)]
        kept = report(ranks=busy, sent_at=clock.now - 2, replayed=True)
        assert client.post(URL, json=kept).status_code == 202
        # At its own time it is the present: the history has what the monitor would have said then.
        assert _history(client)[-1][1] == "slow_compute"
        job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
        assert job["verdict"] == "unknown", job["summary"]
        # The first live report ends the wait: the monitor judges what it says.
        live = report(ranks=_ranks(clock, 4), sent_at=clock.now)
        assert client.post(URL, json=live).status_code == 202
        monitor_of(client).tick()
        job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
        assert job["verdict"] != "unknown", job["summary"]


def test_an_alarm_raised_by_replayed_reports_is_history_not_the_present(settings: Settings, store: Store,
                                                                       clock: FakeClock) -> None:
    # The outage's kept reports show both ranks busy with no step for 30 s, twice: at their own
    # time that is slow compute, confirmed (the history has it). After the restart the monitor
    # has no live report yet: it says it cannot see, not the past's alarm held as the present.
    ticking = dataclasses.replace(settings, tick_interval_s=3600.0, confirm_alarms=True)
    with TestClient(create_app(ticking, store, clock=clock)) as client:
        for step in range(1, 4):
            assert client.post(URL, json=report(ranks=_ranks(clock, step), sent_at=clock.now)).status_code == 202
            monitor_of(client).tick()
            clock.advance(1)
        last_step_at = clock.now - 1
        stale = [(last_step_at - 0.5, 2), (last_step_at, 3)]
        busy = [rank(rank=r, cpu_percent=99.0, progress=progress(3, 3, stale)) for r in (0, 1)]
        clock.advance(60)
        for taken in (clock.now - 40, clock.now - 39):
            assert client.post(URL, json=report(ranks=busy, sent_at=taken, replayed=True)).status_code == 202
        assert "slow_compute" in [verdict for _, verdict, _ in _history(client)]
        monitor_of(client).tick()
        job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
        assert job["verdict"] == "unknown", job["summary"]


def test_a_live_pass_between_replays_leaves_each_replayed_verdict_at_its_own_time(
        client: TestClient, clock: FakeClock) -> None:
    """CI's outage e2e: the monitor's own pass ran while the agent's kept reports were arriving. From
    the half-rebuilt picture (rank 1 ended cleanly, rank 0 silent since) it judged at the present:
    rank_exited, recorded then; the replay that showed rank 0 failing at its own time then recorded
    nothing, its verdict being the last one recorded. Judged at the present, that picture is unknown."""
    for step in range(1, 4):
        assert client.post(URL, json=report(ranks=_ranks(clock, step), sent_at=clock.now)).status_code == 202
        monitor_of(client).tick()
        clock.advance(1)
    # Rank 1 leaves the loop cleanly just after a step: at that moment rank 0 is not held up yet.
    clean = rank(rank=1, alive=False, exit={"at": clock.now, "code": 0, "signal": None, "source": "proc"},
                 cpu_percent=None)
    waiting = rank(rank=0, cpu_percent=0.0, progress=progress(4, 4, [(clock.now - 0.5, 3), (clock.now, 4)]))
    kept = [report(ranks=[waiting, clean], sent_at=clock.now, replayed=True)]
    clock.advance(3)
    failed_at = clock.now
    failed = rank(rank=0, alive=False, exit={"at": clock.now, "code": 1, "signal": None, "source": "proc"},
                  cpu_percent=None)
    kept.append(report(ranks=[failed, clean], sent_at=clock.now, replayed=True))
    clock.advance(30)
    back = clock.now

    assert client.post(URL, json=kept[0]).status_code == 202
    monitor_of(client).tick()  # the present, between two replays
    job = client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]
    assert job["verdict"] == "unknown" and "kept through an outage" in job["summary"], job["summary"]
    assert client.post(URL, json=kept[1]).status_code == 202
    monitor_of(client).tick()

    history = _history(client)
    assert (failed_at, "rank_exited", [1]) in history, history
    assert not [h for h in history if h[0] >= back and h[1] != "unknown"], history
    # Each verdict once: the present's passes and the replays, interleaved, recorded nothing twice.
    assert len([h for h in history if h[1] == "rank_exited"]) == 1, history
    assert len([h for h in history if h[1] == "unknown"]) == 1, history
    assert client.post(URL, json=report(ranks=[failed, clean], sent_at=clock.now)).status_code == 202
    monitor_of(client).tick()
    assert client.get("/diagnose", params={"format": "json"}).json()["jobs"][0]["verdict"] == "rank_exited"
