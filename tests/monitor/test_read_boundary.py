"""Answers, routes and /metrics read what the engine publishes, never the live records.

Three locks on that door: the import contract (pyproject.toml, "Answers and routes read published
results") keeps the record modules out of monitor.present, monitor.web and monitor.relay; the
``Monitor``'s live records are private, and no code there touches a private member; and what the
``Monitor`` shows in public is immutable or a collaborator with its own locking.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

from monitor.diagnosis import Diagnosis
from monitor.engine.published import MonitorFigures, TimelineSpans
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


# Every public member of Monitor, by what it is. A new one fails here until it is put in its place: a
# read must return what ``_assert_detached`` accepts (checked below, on a job with every kind of data).
READS = {"results", "status", "figures", "nodes", "rank_timeline", "job_ids", "node_ids", "resolve", "knows_job",
         "history", "suspect_nodes", "cached_suspect_nodes", "readiness", "owes_full"}
WRITES = {"ingest", "ingest_summary", "refusal", "make_room", "without_jobs", "reject", "replay", "tick", "tick_steps",
          "forget_stale", "answer_owed_delta"}


def test_every_public_member_of_the_monitor_is_a_known_read_or_write():
    public = {name for name in dir(Monitor) if not name.startswith("_")}
    assert public == READS | WRITES, "classify the new member: a read returns published copies only"


def _host(name: str, address: str) -> dict:
    return {"hostname": name, "interfaces": [{"name": "eth0", "addresses": [f"{address}/24"]}]}


def _rich_monitor(store: Store) -> Monitor:
    """A job under two spellings (an alias), a rank claimed by a second node (a conflict), progress of
    its own and of the job's log, costs under an alarm."""
    monitor = Monitor(store, clock=lambda: 100.0, confirm_alarms=False,
                      diagnose=lambda view: Diagnosis("deadlock", (1,), 99.0, "stuck"))
    points = {"step": 7, "pattern": "step", "recent": [[99.0, 6], [100.0, 7]]}
    monitor.ingest(_report(node="node-a", host=_host("node-a", "10.0.0.1"), sent_at=100.0,
                           ranks=[rank(job_id="node-a:29500", rank=0, world_size=3, progress=points)]),
                   received_at=100.0)
    monitor.ingest(_report(node="node-b", host=_host("node-b", "10.0.0.2"), sent_at=100.0,
                           ranks=[rank(job_id="10.0.0.1:29500", rank=1, world_size=3, pid=2001)]),
                   received_at=100.0)
    monitor.ingest(_report(node="node-c", host=_host("node-c", "10.0.0.3"), sent_at=100.0,
                           ranks=[rank(job_id="10.0.0.1:29500", rank=1, world_size=3, pid=5001)]),
                   received_at=100.0)
    return monitor


def test_published_results_hold_no_live_record(tmp_path):
    """Every value reachable from what a read returns is a frozen dataclass, a tuple, a frozenset or a
    plain value (the dicts and lists it holds are its own, made for it), and none is an object the
    live records hold."""
    store = Store(tmp_path / "m.db", clock=lambda: 100.0)
    try:
        monitor = _rich_monitor(store)
        [result] = monitor.results()
        assert result.aliases and result.rank_conflicts and any(r.progress_points for r in result.view.ranks)
        job_id = result.view.job_id
        live = _live_objects(monitor._state)
        for name, value in {"results": monitor.results(), "status": monitor.status(), "figures": monitor.figures(),
                            "nodes": monitor.nodes(), "job_ids": monitor.job_ids(), "node_ids": monitor.node_ids(),
                            "rank_timeline": monitor.rank_timeline(job_id, 100.0, (1,), limit=4),
                            "resolve": monitor.resolve("10.0.0.1:29500"), "knows_job": monitor.knows_job(job_id),
                            "history": monitor.history(job_id), "suspect_nodes": monitor.suspect_nodes(60.0),
                            "cached_suspect_nodes": monitor.cached_suspect_nodes(),
                            "readiness": monitor.readiness()}.items():
            _assert_detached(value, name, live=live)
        # A new report makes a new result; the one published before is left as it was.
        monitor.ingest(_report(node="node-a", host=_host("node-a", "10.0.0.1"), sent_at=101.0,
                               ranks=[rank(job_id="node-a:29500", rank=0, world_size=3)]), received_at=101.0)
        [newer] = monitor.results(101.0)
        assert newer is not result and result.view.now == 100.0
    finally:
        store.close()


def _live_objects(root: object) -> set[int]:
    """The ids of every mutable object the live records reach (their dicts, lists, deques, sets, records)."""
    seen: set[int] = set()
    mutable: set[int] = set()
    stack = [root]
    while stack:
        value = stack.pop()
        if id(value) in seen or isinstance(value, (int, float, bool, str, bytes, type(None))):
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            mutable.add(id(value))
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, set, collections.deque)):
            mutable.add(id(value))
            stack.extend(value)
        elif isinstance(value, (tuple, frozenset)):
            stack.extend(value)
        elif hasattr(value, "__dict__") and not callable(value):
            if not (dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen):
                mutable.add(id(value))
            stack.extend(vars(value).values())
    return mutable


def _immutable(value: object) -> bool:
    return isinstance(value, IMMUTABLE) or (dataclasses.is_dataclass(value)
                                            and type(value).__dataclass_params__.frozen)


def _report(**fields):
    return decode_report(json.dumps(report(**fields)))


def _assert_detached(value: object, path: str, seen: set[int] | None = None, live: set[int] = frozenset()) -> None:
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    assert id(value) not in live, f"{path} is an object the live records hold"
    if isinstance(value, (int, float, bool, str, bytes, type(None))):
        return
    if isinstance(value, (tuple, frozenset, list)):  # a list: made for the caller
        for i, item in enumerate(value):
            _assert_detached(item, f"{path}[{i}]", seen, live)
        return
    if isinstance(value, dict):  # a copy made at publication: checked for what it holds
        for key, item in value.items():
            _assert_detached(key, f"{path}.key", seen, live)
            _assert_detached(item, f"{path}[{key!r}]", seen, live)
        return
    assert dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen, \
        f"{path} is a {type(value).__name__}, not a frozen value"
    for f in dataclasses.fields(value):
        _assert_detached(getattr(value, f.name), f"{path}.{f.name}", seen, live)


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


def test_the_import_contracts_hold():
    """pyproject.toml's contracts, the read boundary's among them (scripts/test.sh runs them too)."""
    found = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=ROOT,
                           capture_output=True, text=True)
    assert found.returncode == 0, found.stdout[-4000:] + found.stderr[-2000:]
    assert "Answers and routes read published results, not live records KEPT" in found.stdout
