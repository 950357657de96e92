"""Handing the memory the monitor freed back to the system (glibc's ``malloc_trim``).

glibc keeps what the process frees in its heaps, for reuse, instead of returning it: after a flood
of padded reports (1.3-MB request bodies, each decoded into 650 lines of 2 KB, most of it dropped
at once) the monitor's RSS stayed far above what it still used (benchmarks/abuse.py, case padded:
1,071 MiB in one run, where a trimmed monitor keeping the same junk settles at 230-240;
``mallinfo2`` in another: 288 MiB of heap, 158 MiB of it free; ``malloc_trim(0)`` called from a
debugger took a third from 261 to 183 MiB). ``malloc_trim(0)`` returns the free pages of every
heap, those between chunks in use included.

It takes a few milliseconds per hundred MiB of heap and holds the heap's lock meanwhile, so it runs
on a worker thread (ctypes lets the GIL go), at most every CHECK_EVERY_S, and only when glibc holds
at least MIN_FREE_BYTES free and what it holds moved by as much since the last trim (the free
chunks stay free after one, only their pages go): an idle or steady monitor is left alone. Where
the C library is not glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("hangwatch.monitor")

CHECK_EVERY_S = 5.0
MIN_FREE_BYTES = 16 * 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "malloc_trim"):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    if hasattr(libc, "mallinfo2"):  # glibc 2.33 and later
        libc.mallinfo2.restype = _MallInfo2
    return libc


@dataclass
class HeapTrimmer:
    """``due`` after each diagnosis pass (on the event loop); ``trim`` on a worker thread."""

    check_every_s: float = CHECK_EVERY_S
    min_free_bytes: int = MIN_FREE_BYTES
    last_check_at: float = float("-inf")
    trims: int = 0
    # glibc's bytes in use and free after the last trim.
    _heap_at_trim: tuple[int, int] = (0, 0)
    _libc: ctypes.CDLL | None = field(default_factory=_glibc)

    def due(self, now: float) -> bool:
        if self._libc is None or now - self.last_check_at < self.check_every_s:
            return False
        self.last_check_at = now
        return True

    def trim(self) -> bool:
        """Return the heaps' free pages to the system if they hold enough; True if it trimmed."""
        libc = self._libc
        if libc is None:
            return False
        # Without mallinfo2 (an older glibc) nothing says how much is free: trim every time.
        if hasattr(libc, "mallinfo2"):
            heap = libc.mallinfo2()
            in_use_then, free_then = self._heap_at_trim
            moved = abs(heap.uordblks - in_use_then) + abs(heap.fordblks - free_then)
            if heap.fordblks < self.min_free_bytes or moved < self.min_free_bytes:
                return False
        started = time.perf_counter()
        libc.malloc_trim(0)
        self.trims += 1
        if hasattr(libc, "mallinfo2"):
            heap = libc.mallinfo2()
            self._heap_at_trim = (heap.uordblks, heap.fordblks)
        log.debug("malloc_trim in %.1f ms", (time.perf_counter() - started) * 1000)
        return True
