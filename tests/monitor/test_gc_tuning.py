"""The monitor keeps CPython's cyclic GC off its large, acyclic state (monitor/web/gc_tuning.py)."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor_testkit import TestClient

from monitor.web.app import create_app
from monitor.web.gc_tuning import FEW_FOUND, FULL_FIRST_S, FULL_MAX_S, GcTamer
from monitor.web.settings import Settings
from monitor.storage.store import open_store


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was, whatever the tamer did to it; the garbage other tests of
    this worker left (frozen by their monitors' tamers, or never collected) freed first, so that what a
    test's collections find is its own (CI: a first collection found thousands of others' objects)."""
    enabled = gc.isenabled()
    gc.unfreeze()
    gc.collect()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def test_automatic_collections_stop_after_a_pass_and_the_periodic_full_one_still_runs(collector: None) -> None:
    tamer = GcTamer(last_full_at=0.0)
    frozen_before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # survivors of a pass
    tamer.after_pass(now=1.0)
    assert not gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(kept)
    # A cycle formed meanwhile is freed by the periodic full collection.
    watched = weakref.ref(Cyclic())
    assert watched() is not None
    tamer.after_pass(now=FULL_FIRST_S + 1)
    assert watched() is None
    assert gc.get_freeze_count() == 0 and tamer.last_full_at == FULL_FIRST_S + 1
    assert not gc.isenabled()


class Cyclic:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.mark.parametrize(("garbage", "next_every_s"), [(0, 4 * FULL_FIRST_S), (2 * FEW_FOUND, FULL_FIRST_S)])
def test_full_collections_grow_rarer_while_they_find_little(garbage: int, next_every_s: float,
                                                          collector: None) -> None:
    tamer = GcTamer(last_full_at=0.0)
    tamer.after_pass(now=FULL_FIRST_S)  # the first: the interval doubles (little was found)...
    assert tamer.full_every_s == 2 * FULL_FIRST_S
    tamer.after_pass(now=2 * FULL_FIRST_S)  # ...so 10 minutes on, none
    assert tamer.last_full_at == FULL_FIRST_S
    for _ in range(garbage // 2):
        Cyclic()  # each a cycle of the object and its __dict__
    tamer.after_pass(now=3 * FULL_FIRST_S)
    assert tamer.last_full_at == 3 * FULL_FIRST_S and tamer.full_every_s == next_every_s
    tamer.full_every_s = FULL_MAX_S
    tamer.after_pass(now=3 * FULL_FIRST_S + FULL_MAX_S)
    assert tamer.full_every_s == FULL_MAX_S  # never past the most


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
