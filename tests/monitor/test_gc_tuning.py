"""The monitor keeps CPython's cyclic GC off its large, acyclic state (monitor/app.py, _tame_gc)."""

from __future__ import annotations

import gc

from monitor.app import FULL_GC_EVERY_S, NO_AUTOMATIC_FULL_GC, _tame_gc


def test_full_collections_are_left_to_the_periodic_one_and_survivors_are_frozen() -> None:
    thresholds = gc.get_threshold()
    try:
        frozen_before = gc.get_freeze_count()
        kept = [[i] for i in range(1000)]  # survivors of a pass
        assert _tame_gc(full_gc_at=0.0, now=1.0) == 0.0
        assert gc.get_threshold()[:2] == thresholds[:2]  # the young generations as before
        assert gc.get_threshold()[2] == NO_AUTOMATIC_FULL_GC
        assert gc.get_freeze_count() >= frozen_before + len(kept)
        # Due: the periodic full collection runs, over everything, and says when.
        assert _tame_gc(full_gc_at=0.0, now=FULL_GC_EVERY_S + 1) == FULL_GC_EVERY_S + 1
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
