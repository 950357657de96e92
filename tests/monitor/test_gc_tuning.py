"""The monitor keeps CPython's cyclic GC off its large, acyclic state (monitor/app.py, _tame_gc)."""

from __future__ import annotations

import gc
import time
from pathlib import Path

from monitor_testkit import TestClient

from monitor.app import FULL_GC_EVERY_S, _tame_gc, create_app
from monitor.settings import Settings
from monitor.store import open_store


def test_automatic_collections_stop_after_a_pass_and_the_periodic_full_one_still_runs() -> None:
    enabled = gc.isenabled()
    try:
        frozen_before = gc.get_freeze_count()
        kept = [[i] for i in range(1000)]  # survivors of a pass
        assert _tame_gc(full_gc_at=0.0, now=1.0) == 0.0
        assert not gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(kept)
        # A cycle formed meanwhile is freed by the periodic full collection, which says when it ran.
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert _tame_gc(full_gc_at=0.0, now=FULL_GC_EVERY_S + 1) == FULL_GC_EVERY_S + 1
        assert gc.get_freeze_count() == 0
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def test_an_app_that_stops_gives_its_process_the_collector_back(tmp_path: Path) -> None:
    assert gc.isenabled()
    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 0.05})
    store = open_store(settings)
    try:
        with TestClient(create_app(settings, store)) as client:
            deadline = time.monotonic() + 10
            while gc.isenabled() and time.monotonic() < deadline:  # the first pass turns it off
                client.get("/healthz")
                time.sleep(0.01)
            assert not gc.isenabled()
        assert gc.isenabled()
    finally:
        store.close()
        gc.enable()
