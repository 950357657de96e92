"""A job's history records each verdict once, also when the monitor forgot the job in between."""

from __future__ import annotations

import orjson
from monitor_reports import progress, rank, report
from monitor_testkit import FakeClock

from monitor.diagnosis import Diagnosis
from monitor.engine.service import Monitor
from monitor.ingest.fastwire import decode_report
from monitor.storage.store import Store


def _healthy(view):
    return Diagnosis("healthy", (), None, "ok")


def _body(clock: FakeClock, step: int, replayed: bool = False):
    recent = [(clock.now - 0.5, step - 1), (clock.now, step)]
    return decode_report(orjson.dumps(report(ranks=[rank(rank=0, progress=progress(step, step, recent))],
                                             sent_at=clock.now, replayed=replayed)))


def _history(store: Store) -> list[tuple[float, str]]:
    store.flush()
    return [(c.at, c.verdict) for c in store.verdict_history("job-a")]


def test_a_restart_that_finds_the_job_silent_does_not_record_its_verdict_again(tmp_path):
    """Down 700 s (past the job retention, within the snapshots'): the restarted monitor forgets the job
    at its first pass; the agent's kept reports and its next live one find the job healthy, as its
    history already says."""
    clock = FakeClock()
    store = Store(tmp_path / "m.db", clock=clock)
    monitor = Monitor(store, clock=clock, diagnose=_healthy, tick_interval_s=1.0)
    for step in range(1, 4):
        monitor.ingest(_body(clock, step))
        monitor.tick()
        clock.advance(1)
    first = _history(store)
    assert [v for _, v in first] == ["healthy"]
    store.close()

    kept = []
    for step in range(4, 11):
        clock.advance(100)
        kept.append(_body(clock, step, replayed=True))
    store = Store(tmp_path / "m.db", clock=clock)
    try:
        monitor = Monitor(store, clock=clock, diagnose=_healthy, tick_interval_s=1.0)
        assert monitor.replay() == 1
        monitor.tick()  # the app's first pass, before the agent is back: the job is past its retention
        assert monitor.job_ids() == frozenset()
        for body in kept:
            monitor.ingest(body)
        monitor.ingest(_body(clock, 11))
        monitor.tick()
        assert _history(store) == first
    finally:
        store.close()


def test_a_job_forgotten_long_ago_starts_its_history_again(tmp_path):
    """Past FORGOTTEN_KEPT_S the ledger lets a forgotten job go: its return is news, recorded."""
    from monitor.engine.verdict_ledger import FORGOTTEN_KEPT_S

    clock = FakeClock()
    store = Store(tmp_path / "m.db", clock=clock)
    try:
        monitor = Monitor(store, clock=clock, diagnose=_healthy, tick_interval_s=1.0)
        monitor.ingest(_body(clock, 1))
        monitor.tick()
        clock.advance(monitor.settings.job_retention_s + 1)
        monitor.tick()
        assert monitor.job_ids() == frozenset()
        clock.advance(FORGOTTEN_KEPT_S + 1)
        monitor.tick()
        monitor.ingest(_body(clock, 2))
        monitor.tick()
        assert [v for _, v in _history(store)] == ["healthy", "healthy"]
    finally:
        store.close()
