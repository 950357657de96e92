"""Answers, routes and /metrics read what the engine publishes, never the live records.

Three locks on that door: the import contract (pyproject.toml, "Answers and routes read published
results") keeps the record modules out of monitor.present, monitor.web and monitor.relay; the
``Monitor``'s live records are private, and no code there touches a private member; and what the
``Monitor`` shows in public is immutable or a collaborator with its own locking.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

from monitor.diagnosis import Diagnosis
from monitor.engine.published import JobResult, MonitorFigures, TimelineSpans
from monitor.engine.service import Monitor
from monitor.storage.store import Store
from monitor.ingest.fastwire import decode_report
from tests.monitor.monitor_reports import rank, report

ROOT = Path(__file__).resolve().parents[2]
READ_SIDE = ["monitor/present", "monitor/web", "monitor/relay"]
# Public attributes of a Monitor that are objects with methods of their own, not records a read could
# walk while a report changes them: the store (its own writer thread and lock), the limits (frozen),
# orders and actions and captures (the ingest route and the actions loop call their methods).
COLLABORATORS = {"store", "limits", "orders", "actions", "captures", "clock", "after_giant_diagnosis"}
IMMUTABLE = (int, float, bool, str, type(None), frozenset, tuple)


def test_no_read_side_code_touches_a_private_member():
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "SLF001",
                            "--output-format", "concise", *READ_SIDE], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


def test_what_a_monitor_shows_in_public_is_immutable_or_a_collaborator(tmp_path):
    store = Store(tmp_path / "m.db", clock=lambda: 100.0)
    try:
        monitor = Monitor(store, clock=lambda: 100.0)
        monitor.ingest(_report(sent_at=100.0), received_at=100.0)
        live = {name: type(value).__name__ for name, value in vars(monitor).items()
                if not name.startswith("_") and name not in COLLABORATORS and not _immutable(value)}
        assert live == {}, f"public live state on Monitor (make it private, publish a copy): {live}"
    finally:
        store.close()


def test_published_results_hold_no_live_record(tmp_path):
    """Every value reachable from a published result is a frozen dataclass, a tuple, a frozenset or a
    plain value (the dicts it holds are its own copies, made when it was published)."""
    store = Store(tmp_path / "m.db", clock=lambda: 100.0)
    try:
        monitor = Monitor(store, clock=lambda: 100.0, confirm_alarms=False,
                          diagnose=lambda view: Diagnosis("deadlock", (1,), 99.0, "stuck"))
        monitor.ingest(_report(sent_at=100.0), received_at=100.0)
        [result] = monitor.results()
        _assert_detached(result, "result")
        _assert_detached(monitor.figures(), "figures")
        _assert_detached(monitor.rank_timeline(result.view.job_id, 100.0, (1,), limit=4), "timeline")
        assert isinstance(result, JobResult)
        monitor.ingest(_report(sent_at=101.0), received_at=101.0)
        # A new report makes a new result; the one published before is left as it was.
        [newer] = monitor.results(101.0)
        assert newer is not result and result.view.now == 100.0
    finally:
        store.close()


def _immutable(value: object) -> bool:
    return isinstance(value, IMMUTABLE) or (dataclasses.is_dataclass(value)
                                            and type(value).__dataclass_params__.frozen)


def _report(**fields):
    return decode_report(json.dumps(report(**fields)))


def _assert_detached(value: object, path: str, seen: set[int] | None = None) -> None:
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, (int, float, bool, str, bytes, type(None))):
        return
    if isinstance(value, (tuple, frozenset)):
        for i, item in enumerate(value):
            _assert_detached(item, f"{path}[{i}]", seen)
        return
    if isinstance(value, dict):  # a copy made at publication: checked for what it holds
        for key, item in value.items():
            _assert_detached(key, f"{path}.key", seen)
            _assert_detached(item, f"{path}[{key!r}]", seen)
        return
    assert dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen, \
        f"{path} is a {type(value).__name__}, not a frozen value"
    for f in dataclasses.fields(value):
        _assert_detached(getattr(value, f.name), f"{path}.{f.name}", seen)


def test_figures_and_timelines_are_read_while_reports_arrive(tmp_path):
    """/metrics renders on a worker thread: reading the published figures while another thread
    ingests reports of new nodes and jobs never trips over a changing dict."""
    store = Store(tmp_path / "m.db", clock=lambda: 100.0)
    errors: list[BaseException] = []
    try:
        monitor = Monitor(store, clock=lambda: 100.0)
        stop = threading.Event()

        def ingest() -> None:
            try:
                for i in range(400):
                    monitor.ingest(_report(node=f"node-{i}", ranks=[rank(job_id=f"job-{i}")], sent_at=100.0),
                                   received_at=100.0)
            except BaseException as e:  # noqa: BLE001 -- reported below
                errors.append(e)
            finally:
                stop.set()

        writer = threading.Thread(target=ingest)
        writer.start()
        reads = 0
        while not stop.is_set() or reads == 0:
            figures = monitor.figures()
            assert isinstance(figures, MonitorFigures) and figures.nodes == len(figures.node_summaries)
            for job_id in monitor.job_ids():
                assert isinstance(monitor.rank_timeline(job_id, 100.0), TimelineSpans)
            reads += 1
        writer.join()
        assert errors == []
        assert monitor.figures().jobs == 400
    finally:
        store.close()
