"""monitor/web/heap_trim.py: freed heap goes back to the system once, and a steady heap is left alone."""

from __future__ import annotations

import pytest

from monitor.web.heap_trim import HeapTrimmer


def test_it_is_due_at_most_every_interval() -> None:
    trimmer = HeapTrimmer(check_every_s=5.0)
    if trimmer._libc is None:
        pytest.skip("not glibc: nothing to trim")
    assert trimmer.due(100.0)
    assert not trimmer.due(104.0)
    assert trimmer.due(105.0)


def test_a_large_free_is_trimmed_once() -> None:
    trimmer = HeapTrimmer(min_free_bytes=16 * 1024 * 1024)
    if trimmer._libc is None or not hasattr(trimmer._libc, "mallinfo2"):
        pytest.skip("not glibc 2.33 or later: no mallinfo2")
    trimmer.trim()  # whatever the test process freed before
    # 64 MiB of 2-KB strings (past pymalloc's small objects: glibc's), every tenth kept so that the
    # free chunks lie between chunks in use, as after a flood, not at the heap's top.
    lines = [str(n).ljust(2048, "x") for n in range(32 * 1024)]
    kept = lines[::10]
    del lines
    assert trimmer.trim()
    assert not trimmer.trim()  # nothing moved since
    assert kept
