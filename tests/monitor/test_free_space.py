"""Free space checked before captures and snapshots are written (monitor/storage/free_space.py): a write that
would leave the volume under min_free_bytes is refused and counted, logged once a minute, and what was
kept stays. The volume is a real tmpfs of 2 MiB where the exact figures matter (the tests run as root);
tests/monitor/test_readiness.py shows the same on a real monitor's /metrics and /readyz."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from monitor.storage.capture_store import CaptureRefused, CaptureStore
from monitor.storage.free_space import FreeSpace
from monitor.storage.store import Store, VerdictChange
from tests.tmpfs import mounted_tmpfs

MIB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _statvfs(free_bytes: int) -> os.statvfs_result:
    # f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail, f_flag, f_namemax
    return os.statvfs_result((4096, 4096, 1 << 20, free_bytes // 4096, free_bytes // 4096, 0, 0, 0, 0, 255))


def test_a_short_volume_refuses_and_says_so_once_a_minute(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    free = [300 * MIB]
    space = FreeSpace("store", tmp_path / "not-yet" / "monitor.db", 256 * MIB, clock=clock,
                      statvfs=lambda path: _statvfs(free[0]))
    assert space.reading().free_bytes == 300 * MIB  # a path not made yet: its nearest existing parent's volume
    assert not space.refuses("snapshots", incoming=10 * MIB)
    assert space.refuses("snapshots", incoming=50 * MIB)  # would leave 250 MiB
    free[0] = 100 * MIB
    with caplog.at_level(logging.ERROR, logger="hangwatch.monitor.store"):
        for _ in range(100):
            assert space.refuses("snapshots")
        clock.now += 61
        assert space.refuses("snapshots")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # the first refusal (above) and one a minute later: not one per write
    assert "would have 250.0 MiB free, under min_free_bytes (256.0 MiB): snapshots refused" in lines[0]
    assert "would have 100.0 MiB free" in lines[1]
    free[0] = 300 * MIB
    assert not space.refuses("snapshots")  # freed by hand: taken again at once
    assert not FreeSpace("store", tmp_path, 0, statvfs=lambda path: _statvfs(0)).refuses("snapshots")  # 0: off


def test_snapshots_are_refused_on_a_short_volume_and_the_history_still_written(tmp_path: Path) -> None:
    """The real volume under tmp_path, with a min_free_bytes no disk has: the real statvfs, refusing."""
    db = tmp_path / "monitor.db"
    store = Store(db, min_free_bytes=0)
    store.add_snapshot("node-a", time.time() - 2, b'{"kept": 1}')
    store.close()
    store = Store(db, min_free_bytes=1 << 60)
    try:
        store.add_snapshot("node-a", time.time() - 1, b'{"refused": 1}')
        store.add_verdict(VerdictChange("job-a", time.time(), "deadlock", (1,), "stuck"))
        store.flush()
        assert store.figures().snapshots_low_space == 1 and store.figures().ok
        assert [s.body for s in store.recent_snapshots(0)] == [b'{"kept": 1}']  # nothing kept is lost
        assert [c.verdict for c in store.verdict_history("job-a")] == ["deadlock"]
        volume = store.volume()
        assert volume is not None and volume.short and volume.name == "store"
    finally:
        store.close()


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "volume", "2m") as mount:
        yield mount


async def _chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.live  # mounts a tmpfs
def test_a_capture_part_that_would_leave_the_volume_short_is_refused_mid_stream(small_volume: Path) -> None:
    clock = Clock()
    store = CaptureStore(small_volume / "captures", clock=clock, min_free_bytes=1 * MIB)
    bundle = store.open_bundle("job-a", "deadlock", [1], clock.now, {"node-a": [11], "node-b": [12], "node-c": [13]})
    assert asyncio.run(store.receive_part(bundle.id, "node-a", _chunks(b"A" * 200_000))) == 200_000
    # About 1.6 MiB free: a part of 1 MiB would leave less than 1 MiB. Refused as it streams, its file removed.
    with pytest.raises(CaptureRefused) as refused:
        asyncio.run(store.receive_part(bundle.id, "node-b", _chunks(b"B" * MIB)))
    assert (refused.value.status, refused.value.reason) == (507, "low_space")
    assert "capture volume is nearly full" in refused.value.detail
    assert sorted(p.name for p in (small_volume / "captures" / bundle.id).iterdir()) == ["bundle.json",
                                                                                           "node-a.json.gz"]
    assert (store.refusals["low_space"], store.parts_refused) == (1, 1)
    # A small part still fits, and node-b may send again; what was kept stays.
    assert asyncio.run(store.receive_part(bundle.id, "node-b", _chunks(b"b" * 1000))) == 1000
    # Filled by something else: refused before a byte is written.
    filler = small_volume / "filler"
    filler.write_bytes(b"\0" * (store.volume().free_bytes - MIB // 2))
    with pytest.raises(CaptureRefused) as refused:
        asyncio.run(store.receive_part(bundle.id, "node-c", _chunks(b"C" * 10)))
    assert refused.value.reason == "low_space"
    assert store.bundles()[0]["refused"] == {"node-b": store.get(bundle.id).refused["node-b"],
                                              "node-c": refused.value.detail}
    assert (store.get(bundle.id).received, store.refusals["low_space"]) == ({"node-a": 200_000, "node-b": 1000}, 2)
    filler.unlink()
    assert asyncio.run(store.receive_part(bundle.id, "node-c", _chunks(b"C" * 10))) == 10
