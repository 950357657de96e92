"""Capture bundles on disk (monitor/storage/capture_store.py): streamed parts, bounds, the tar, a restart."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from monitor.storage.capture_store import CaptureRefused, CaptureStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def _chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def _receive(store: CaptureStore, bundle: str, node: str, data: bytes) -> int:
    return asyncio.run(store.receive_part(bundle, node, _chunks(data)))


def _store(tmp_path: Path, clock: Clock, **bounds) -> CaptureStore:
    return CaptureStore(tmp_path / "captures", clock=clock, **bounds)


def test_parts_land_as_files_and_the_tar_holds_them(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock)
    bundle = store.open_bundle("10.0.0.1:29500", "deadlock", [1], clock.now - 20, {"node-a": [11, 12], "node-b": [13]})
    assert bundle.id == "10.0.0.1_29500-20270115T075940Z"  # the job, and when its incident began
    assert _receive(store, bundle.id, "node-a", b"A" * 5000) == 5000
    [listed] = store.bundles("10.0.0.1:29500")
    assert (listed["nodes_asked"], listed["nodes_received"], listed["bytes"]) == (2, 1, 5000)
    with tarfile.open(fileobj=io.BytesIO(b"".join(store.tar_stream(bundle.id)))) as tar:
        assert tar.getnames() == [f"{bundle.id}/bundle.json", f"{bundle.id}/node-a.json.gz"]
        assert tar.extractfile(f"{bundle.id}/node-a.json.gz").read() == b"A" * 5000
        assert json.loads(tar.extractfile(f"{bundle.id}/bundle.json").read())["received"] == {"node-a": 5000}
    # A second incident of the job gets a bundle of its own.
    assert store.open_bundle("10.0.0.1:29500", "deadlock", [1], clock.now - 20, {"node-a": [11]}).id == \
        f"{bundle.id}-2"


@pytest.mark.parametrize(("node", "first", "status"), [
    ("node-z", None, 409),  # not asked
    ("node-a", b"x", 409),  # sent already
])
def test_an_upload_that_was_not_asked_for_is_refused(tmp_path: Path, node: str, first: bytes | None,
                                                     status: int) -> None:
    store = _store(tmp_path, Clock())
    bundle = store.open_bundle("job", "deadlock", [], 0.0, {"node-a": [1]})
    if first is not None:
        _receive(store, bundle.id, "node-a", first)
    with pytest.raises(CaptureRefused) as refused:
        _receive(store, bundle.id, node, b"y")
    assert refused.value.status == status
    with pytest.raises(CaptureRefused) as unknown:
        _receive(store, "no-such-bundle", "node-a", b"y")
    assert unknown.value.status == 404


def test_a_part_past_its_bound_is_cut_off_and_leaves_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path, Clock(), max_part_bytes=4000)
    bundle = store.open_bundle("job", "deadlock", [], 0.0, {"node-a": [1], "node-b": [2]})
    with pytest.raises(CaptureRefused) as refused:
        _receive(store, bundle.id, "node-a", b"x" * 10_000)
    assert refused.value.status == 413
    assert sorted(p.name for p in (tmp_path / "captures" / bundle.id).iterdir()) == ["bundle.json"]
    assert store.bundles()[0]["refused"] == {"node-a": "part over 4000 bytes (the part or bundle limit)"}


def test_old_bundles_and_the_oldest_past_the_room_go(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock, max_total_bytes=10_000, retention_s=3600)
    first = store.open_bundle("job-1", "deadlock", [], clock.now, {"n": [1]})
    _receive(store, first.id, "n", b"x" * 6000)
    clock.now += 10
    second = store.open_bundle("job-2", "deadlock", [], clock.now, {"n": [1]})
    _receive(store, second.id, "n", b"x" * 6000)  # 12,000 bytes in all: the oldest goes
    assert [b["job_id"] for b in store.bundles()] == ["job-2"]
    assert not (tmp_path / "captures" / first.id).exists()
    clock.now += 3601
    store.prune()
    assert store.bundles() == [] and store.total_bytes == 0


def test_a_restarted_monitor_keeps_its_bundles(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock)
    bundle = store.open_bundle("job", "rank_stopped", [3], clock.now, {"n": [1]})
    _receive(store, bundle.id, "n", b"part")
    (tmp_path / "captures" / "junk").mkdir()  # not a bundle: ignored
    again = _store(tmp_path, clock)
    assert [(b["id"], b["bytes"], b["verdict"]) for b in again.bundles()] == [(bundle.id, 4, "rank_stopped")]


def test_capture_orders_a_node_never_takes_expire() -> None:
    from monitor.engine.actions.orders import UNTAKEN_KEPT_S, AgentOrders

    orders = AgentOrders()
    orders.give("gone-node", {"id": "capture-a", "capture": {}}, 1000.0)
    orders.give("live-node", {"id": "capture-b", "capture": {}}, 1000.0)
    assert [o["id"] for o in orders.take("live-node")] == ["capture-b"]
    assert orders.expire(1000.0 + UNTAKEN_KEPT_S / 2) == 0
    assert orders.expire(1001.0 + UNTAKEN_KEPT_S) == 1
    assert orders.take("gone-node") == []
