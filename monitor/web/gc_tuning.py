"""Keeping CPython's cyclic garbage collector off the monitor's hot path.

The monitor's state has no reference cycles: reference counting frees it, and the cyclic GC only
rescanned it. At 10,000 ranks the monitor holds ~500,000 GC-tracked objects, and a second of
reports allocates ~1 M more that live long enough to be scanned by the young collections (a relay's
batch of 256 reports is decoded whole before it is applied). Measured at 1,150 reports a second
(benchmarks/README.md, "1,250 nodes offered on 2 cores, and the monitor's garbage collector"):
decoding a report took 177-282 CPU-us with young collections on and 92-96 without, and CPython's
own full collections paused the loop for up to 0.18 s several times a minute.

So after its first pass the monitor runs no automatic collection at all, and freezes what survives
each pass (a process whose collector is switched back on, as the app's lifespan does at shutdown,
does not rescan it). A full collection now and then frees whatever cycles did form. It pauses the
event loop (~0.9 s at 10,000 ranks), so it comes rarely: 10 minutes after the start, then twice as
long after each that found little (counted every 15 s under the giant job's load and under floods
of refused reports, batches and dropped connections: 0-13 cyclic objects), up to FULL_MAX_S, and
back to FULL_FIRST_S after one that found much.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("hangwatch.monitor")

FULL_FIRST_S = 600.0
FULL_MAX_S = 6 * 3600.0
# A full collection that finds fewer unreachable objects than this found little.
FEW_FOUND = 10_000


@dataclass
class GcTamer:
    """Called after each diagnosis pass (``after_pass``) with the pass's start time."""

    last_full_at: float
    full_every_s: float = FULL_FIRST_S

    def after_pass(self, now: float) -> None:
        gc.disable()
        if now - self.last_full_at < self.full_every_s:
            gc.freeze()
            return
        gc.unfreeze()
        started = time.perf_counter()
        found = gc.collect()
        took = time.perf_counter() - started
        self.last_full_at = now
        self.full_every_s = min(FULL_MAX_S, 2 * self.full_every_s) if found < FEW_FOUND else FULL_FIRST_S
        log.info("full garbage collection: %d unreachable objects found in %.2f s; the next in %.0f min",
                 found, took, self.full_every_s / 60)
