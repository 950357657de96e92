"""Readiness an orchestrator can use (monitor/engine/readiness.py): /readyz is 200 when ready, else 503 naming
each reason; hangwatch_monitor_ready and systemd's STATUS= say the same.

The decision is pure and tested on its facts; the rebuild after a restart on a real store and engine; the
rest on one real monitor (uvicorn on loopback) whose database and captures live on small tmpfs volumes
mounted for the test (the tests run as root), filled for real, and a real relay in front of it."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from monitor_testkit import FakeClock, TestClient
from real_monitor import RunningMonitor, metric, running_monitor, running_relay

from hangwatch.demo.harness import free_port
from monitor.engine.readiness import RebuildProgress, decide
from monitor.engine.service import Monitor
from monitor.ingest.fastwire import decode_report
from monitor.storage.free_space import VolumeSpace
from monitor.storage.store import Store, open_store
from monitor.web.app import create_app
from monitor.web.settings import Settings
from tests.notify_socket import NotifySocket
from tests.tmpfs import mounted_tmpfs

MIB = 1024 * 1024


# --- the decision, on its facts ---

def test_each_fact_is_a_named_reason_and_all_of_them_are_given() -> None:
    roomy, short = VolumeSpace("store", "/s", 300 * MIB, 256 * MIB), VolumeSpace("captures", "/c", 10 * MIB, 256 * MIB)
    ready = decide(None, [roomy], False, None)
    assert ready.ready and ready.status_line() == "ready"
    assert ready.answer() == {"ready": True, "reasons": [],
                              "volumes": [{"volume": "store", "free_bytes": 300 * MIB, "min_free_bytes": 256 * MIB}]}
    shedding = decide(None, [roomy], True, None)
    assert not shedding.ready and [r.reason for r in shedding.reasons] == ["shedding_load"]
    assert shedding.status_line() == "not ready: shedding load"
    everything = decide("disk full: database or disk is full", [roomy, short], True, RebuildProgress(10, 3, 42.4))
    assert [r.reason for r in everything.reasons] == ["store_not_writable", "volume_nearly_full", "shedding_load",
                                                      "rebuilding"]
    assert everything.status_line() == ("not ready: store not writable (disk full); captures volume nearly full; "
                                        "shedding load; rebuilding after a restart")
    details = [r["detail"] for r in everything.answer()["reasons"]]
    assert "database or disk is full" in details[0]
    assert "10.0 MiB free, under min_free_bytes (256.0 MiB): capture parts are refused" in details[1]
    assert "3 of 10 nodes restored from the store" in details[3] and "ready in 42 s at most" in details[3]


# --- the rebuild after a restart: a real store and engine, the clock moved by hand ---

def _full_report(node: str, clock: FakeClock) -> object:
    return decode_report(json.dumps(report(node=node, ranks=[rank(job_id=f"job-{node}")], sent_at=clock.now)))


def test_a_restart_rebuilds_until_the_restored_nodes_report_and_no_longer_than_the_silent_time(
        tmp_path: Path) -> None:
    clock = FakeClock(time.time())
    store = Store(tmp_path / "monitor.db", clock=clock)
    try:
        first = Monitor(store, clock=clock)
        assert first.readiness().ready  # a first start restores nothing: nothing to rebuild
        for node in ("node-a", "node-b", "node-c"):
            first.ingest(_full_report(node, clock))
        store.flush()
        clock.advance(5)
        restarted = Monitor(store, clock=clock)
        assert restarted.replay() == 3
        assert [r.reason for r in restarted.readiness().reasons] == ["rebuilding"]
        restarted.ingest(_full_report("node-a", clock))
        restarted.ingest(_full_report("node-a", clock))  # the same node twice counts once
        restarted.ingest(_full_report("node-b", clock))
        [rebuilding] = restarted.readiness().reasons
        assert rebuilding.detail.startswith("1 of 3 nodes restored from the store have not sent a full report")
        # node-c never comes back: it holds readiness back for job_room_silent_s after the start, no longer.
        clock.advance(restarted.limits.job_room_silent_s - 1)
        assert not restarted.readiness().ready
        clock.advance(1.5)
        assert restarted.readiness().ready
        # Shedding, as the web face says it (monitor/web/load.py), is a reason of its own.
        shedding = Monitor(store, clock=clock, overloaded=lambda: True)
        assert [r.reason for r in shedding.readiness().reasons] == ["shedding_load"]
    finally:
        store.close()


def test_a_node_owing_its_full_report_gets_its_delta_answered_unapplied(tmp_path: Path) -> None:
    """After a restart every restored node owes its full report: its posts are never shed
    (monitor/web/routes/ingest.py), and while the monitor is behind its deltas are answered "send
    the full one" without being applied. A node heard in full, or never heard, is taken as usual."""
    clock = FakeClock(time.time())
    store = Store(tmp_path / "monitor.db", clock=clock)
    nodes = [f"node-{i:02d}" for i in range(4)]
    try:
        first = Monitor(store, clock=clock)
        for node in nodes:
            first.ingest(_full_report(node, clock))
        assert not first.owes_full(nodes[0])
        store.flush()
        clock.advance(5)
        restarted = Monitor(store, clock=clock)
        assert restarted.replay() == 4
        assert all(restarted.owes_full(n) for n in nodes)
        restarted.ingest(_full_report(nodes[0], clock))
        assert not restarted.owes_full(nodes[0])

        def delta(node: str) -> object:
            return decode_report(json.dumps(report(node=node, ranks=[rank(job_id=f"job-{node}")],
                                                   sent_at=clock.now, delta=True)))

        reports_before = restarted.reports_total
        answer = restarted.answer_owed_delta(delta(nodes[1]))
        assert answer is not None and answer.send_full and answer.full_in_s >= 0
        assert restarted.reports_total == reports_before and restarted.figures().deltas_deferred == 1
        assert restarted.answer_owed_delta(delta(nodes[0])) is None  # heard in full: a delta it builds on
        assert restarted.answer_owed_delta(_full_report(nodes[1], clock)) is None  # the full report itself
        assert restarted.answer_owed_delta(delta("node-never-seen")) is None  # through the limits, as any
    finally:
        store.close()


def test_probes_need_no_token_where_everything_else_does(tmp_path: Path) -> None:
    files = {}
    for kind in ("token_file", "read_token_file", "metrics_token_file"):
        files[kind] = tmp_path / kind
        files[kind].write_text(f"{kind}-0123456789abcdef\n")
        files[kind].chmod(0o600)
    settings = Settings.from_raw({"db": tmp_path / "monitor.db", "tick_interval_s": 0, **files})
    store = open_store(settings)
    try:
        with TestClient(create_app(settings, store)) as client:
            assert client.get("/diagnose").status_code == 401 and client.get("/metrics").status_code == 401
            assert client.get("/healthz").text == "ok\n"
            answer = client.get("/readyz")
            assert answer.status_code == 200 and answer.json()["ready"] is True
    finally:
        store.close()


# --- one real monitor on small volumes ---

@dataclass
class Live:
    monitor: RunningMonitor
    state: Path  # the database's volume
    captures: Path  # the captures' volume
    notify: NotifySocket
    first_readyz: httpx.Response  # as it came up


RESTORED = "restored-node"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("readiness")
    notify = NotifySocket(root / "notify.sock")
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(notify.close)
        state = cleanup.enter_context(mounted_tmpfs(root / "state", "8m"))
        captures = cleanup.enter_context(mounted_tmpfs(root / "captures", "2m"))
        # A node a previous run of the monitor kept a snapshot of: this start is a restart.
        seeded = Store(state / "monitor.db", min_free_bytes=0)
        seeded.add_snapshot(RESTORED, time.time(), json.dumps(report(node=RESTORED, ranks=[rank(job_id="job-r")])))
        seeded.close()
        # Shedding only past 4 s of loop lag: a loaded test machine lags too, and would be "not ready" for it.
        env = {"HANGWATCH_MIN_FREE_BYTES": str(MIB), "HANGWATCH_TICK_INTERVAL_S": "0.2", "HANGWATCH_SHED_LAG_S": "4",
               "HANGWATCH_CONFIRM_ALARMS": "false", "NOTIFY_SOCKET": str(notify.path)}
        with running_monitor(root, "--capture-after", "1", "--capture-dir", str(captures), db=state / "monitor.db",
                             extra_env=env) as monitor:
            first = httpx.get(monitor.base + "/readyz", timeout=5)
            yield Live(monitor, state, captures, notify, first)


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _readyz(base: str) -> tuple[int, list[str], dict]:
    answer = httpx.get(base + "/readyz", timeout=5)
    body = answer.json()
    assert body["ready"] == (answer.status_code == 200)
    return answer.status_code, [r["reason"] for r in body["reasons"]], body


def _post(base: str, node: str, *ranks: dict) -> httpx.Response:
    answer = httpx.post(base + "/api/v1/reports", json=report(node=node, ranks=list(ranks), sent_at=time.time()),
                        timeout=5)
    assert answer.status_code == 202, answer.text
    return answer


def _rebuilt(live: Live) -> None:
    """The restored node reports again: the rebuild is over (whichever test runs first)."""
    _post(live.monitor.base, RESTORED, rank(job_id="job-r"))
    _until(lambda: _readyz(live.monitor.base)[0] == 200, 10, f"never ready: {_readyz(live.monitor.base)}")


@pytest.mark.live
def test_a_restarted_monitor_is_ready_once_its_restored_node_reports(live: Live) -> None:
    assert live.first_readyz.status_code == 503
    [reason] = live.first_readyz.json()["reasons"]
    assert reason["reason"] == "rebuilding" and "1 of 1 nodes restored" in reason["detail"]
    assert live.first_readyz.headers["cache-control"] == "no-store"
    assert httpx.get(live.monitor.base + "/healthz", timeout=5).text == "ok\n"  # alive all along
    _rebuilt(live)
    assert metric(live.monitor.base, "hangwatch_monitor_ready") == 1
    # systemd heard the same: READY=1 at start, then the readiness as it changed.
    statuses = live.notify.wait_until(lambda ms: "STATUS=ready" in ms)
    assert any(m.startswith("READY=1") for m in statuses)
    assert statuses.index("STATUS=not ready: rebuilding after a restart") < statuses.index("STATUS=ready")
    # Checked every half second, told only when it changes.
    told = [m for m in statuses if m.startswith("STATUS=")]
    assert all(a != b for a, b in zip(told, told[1:])), told


def _flip(base: str, n: int) -> None:
    """A verdict change, which the monitor writes to its database: rank 1 alive, or gone, by turns."""
    gone = n % 2 == 1
    second = rank(job_id="job-s", rank=1, alive=not gone, pid=2000 + n,
                  **({"exit": {"at": time.time(), "code": 1, "source": "proc"}, "cpu_percent": None} if gone else {}))
    _post(base, "node-s", rank(job_id="job-s", rank=0), second)


@pytest.mark.live
def test_a_full_store_volume_is_not_ready_until_it_has_room_again(live: Live) -> None:
    base = live.monitor.base
    _rebuilt(live)
    filler = live.state / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, timeout=60)
    try:
        # Full: the volume is short at once, and a write to the database fails for real.
        n = 0
        while True:
            status, reasons, body = _readyz(base)
            if status == 503 and "store_not_writable" in reasons:
                break
            assert n < 100, f"the store never failed: {body}"
            _flip(base, n)
            n += 1
            time.sleep(0.2)
        assert reasons == ["store_not_writable", "volume_nearly_full"], body
        assert "disk full" in body["reasons"][0]["detail"]
        assert "the store volume has 0.0 MiB free" in body["reasons"][1]["detail"]
        assert metric(base, "hangwatch_monitor_ready") == 0
        assert metric(base, "hangwatch_monitor_not_ready", reason="store_not_writable") == 1
        assert metric(base, "hangwatch_monitor_not_ready", reason="shedding_load") == 0
        # node-s's first full report came with its snapshot due: refused for the space, counted, logged once.
        assert metric(base, "hangwatch_monitor_snapshots_refused_total", reason="low_space") >= 1
        assert live.notify.wait_until(lambda ms: any(m.startswith("STATUS=not ready: store not writable (disk full)")
                                                     for m in ms))
    finally:
        filler.unlink()
    _until(lambda: _readyz(base)[0] == 200, 20, "never ready again after the volume had room")
    assert metric(base, "hangwatch_monitor_store_up") == 1
    assert live.monitor.log_text().count("snapshots refused") == 1


def _capture_orders(base: str) -> dict[str, dict]:
    """An incident (rank 0 stopped) held past --capture-after: each node's capture order."""
    orders: dict[str, dict] = {}
    deadline = time.monotonic() + 20
    while len(orders) < 2:
        assert time.monotonic() < deadline, f"no capture orders: {orders}"
        for node, r in (("node-c1", rank(job_id="job-c", rank=0, pid=3000, state="T", cpu_percent=0.0)),
                        ("node-c2", rank(job_id="job-c", rank=1, pid=3001, cpu_percent=0.0))):
            for order in _post(base, node, r).json().get("orders", []):
                orders[node] = order["capture"]
        time.sleep(0.2)
    return orders


def _upload(base: str, order: dict) -> httpx.Response:
    return httpx.post(base + order["upload"], content=gzip.compress(b'{"ranks": []}'),
                      headers={"content-type": "application/json", "content-encoding": "gzip"}, timeout=10)


@pytest.mark.live
def test_a_capture_part_is_refused_on_a_nearly_full_volume_and_counted(live: Live) -> None:
    base = live.monitor.base
    _rebuilt(live)
    orders = _capture_orders(base)
    assert _upload(base, orders["node-c1"]).status_code == 201
    filler = live.captures / "filler"
    free = os.statvfs(live.captures)
    filler.write_bytes(b"\0" * (free.f_bavail * free.f_frsize - MIB // 2))  # half of min_free_bytes left
    try:
        refused = _upload(base, orders["node-c2"])
        assert refused.status_code == 507 and "capture volume is nearly full" in refused.json()["detail"]
        assert metric(base, "hangwatch_capture_parts_refused_total", reason="low_space") == 1
        status, reasons, body = _readyz(base)
        assert (status, reasons) == (503, ["volume_nearly_full"]), body
        assert "the captures volume has" in body["reasons"][0]["detail"]
        # What was kept stays.
        [bundle] = httpx.get(f"{base}/api/v1/captures", params={"job": "job-c"}, timeout=5).json()["captures"]
        assert bundle["nodes_received"] == 1 and "node-c2" in bundle["refused"]
        assert (live.captures / bundle["id"] / "node-c1.json.gz").exists()
    finally:
        filler.unlink()
    assert _upload(base, orders["node-c2"]).status_code == 201
    _until(lambda: _readyz(base)[0] == 200, 10, "never ready again after the volume had room")
    assert metric(base, "hangwatch_capture_parts_refused_total", reason="low_space") == 1


@pytest.mark.live
def test_a_relay_is_ready_while_it_reaches_the_monitor(live: Live, tmp_path: Path) -> None:
    with running_relay(tmp_path, live.monitor.base) as relay:
        answer = httpx.get(relay.base + "/readyz", timeout=5)
        assert (answer.status_code, answer.json()) == (200, {"ready": True, "reasons": []})
    with running_relay(tmp_path, f"http://127.0.0.1:{free_port()}") as cut_off:
        answer = httpx.get(cut_off.base + "/readyz", timeout=5)
        assert answer.status_code == 503
        [reason] = answer.json()["reasons"]
        assert reason["reason"] == "monitor_unreachable" and "unreachable" in reason["detail"]
