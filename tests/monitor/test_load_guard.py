"""Shedding decisions, table-style: only past capacity, only nodes heard from moments ago."""

from __future__ import annotations

import pytest

from monitor.web.load import LoadGuard, peek_node


@pytest.mark.parametrize(
    ("lag", "last_accepted", "now", "shed"),
    [
        (0.1, 99.0, 100.0, False),   # keeping up: take everything
        (2.0, 99.0, 100.0, True),    # behind, and this node reported a second ago
        (2.0, 94.0, 100.0, False),   # behind, but nothing from this node for shed_keep_s
        (2.0, None, 100.0, False),   # behind, a node never heard from
        (0.5, 99.0, 100.0, False),   # exactly at the limit is not past it
    ],
)
def test_should_shed(lag: float, last_accepted: float | None, now: float, shed: bool) -> None:
    guard = LoadGuard(shed_lag_s=0.5, shed_keep_s=5.0)
    guard.note_lag(lag, now)
    if last_accepted is not None:
        guard.accepted("n1", last_accepted)
    assert guard.should_shed("n1", now) is shed
    assert guard.shed_total == int(shed)
    assert guard.shed_recently(now) == int(shed)


def test_lag_is_the_worst_of_the_last_second() -> None:
    guard = LoadGuard()
    guard.note_lag(0.9, 10.0)
    guard.note_lag(0.01, 10.5)
    assert guard.lag_s == 0.9 and guard.overloaded
    guard.note_lag(0.01, 11.2)
    assert guard.lag_s == 0.01 and not guard.overloaded


def test_sheds_are_counted_over_a_minute_and_forgotten_nodes_dropped() -> None:
    guard = LoadGuard()
    guard.note_lag(3.0, 0.0)
    guard.accepted("a", 0.0)
    assert guard.should_shed("a", 1.0)
    assert guard.shed_recently(30.0) == 1 and guard.shed_recently(70.0) == 0
    guard.forget({"b"})
    assert not guard.should_shed("a", 1.0)  # no longer known: gets in


@pytest.mark.parametrize(
    ("body", "node"),
    [
        (b'{"schema_version":1,"node":"gpu-07","sent_at":1}', "gpu-07"),
        (b'{"schema_version": 1, "node" : "a.b:c_d-e", "ranks": []}', "a.b:c_d-e"),
        (b'{"ranks": [], "nodes": "x"}', None),
        (b'{"node": "bad name!"}', None),
        (b" " * 600 + b'{"node": "late"}', None),  # not near the start: not worth the scan
        (b"", None),
    ],
)
def test_peek_node(body: bytes, node: str | None) -> None:
    assert peek_node(body) == node


def test_every_probe_lands_in_the_lag_histogram_that_metrics_exports() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from monitor.web.exposition import render
    from monitor.web.metrics import lag_histogram

    guard = LoadGuard()
    for at, lag in enumerate((0.0, 0.003, 0.04, 0.04, 0.3, 7.0)):
        guard.note_lag(lag, float(at))
    (family,) = text_string_to_metric_families(render([lag_histogram(guard)]).decode())
    assert family.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets["0.005"] == 2 and buckets["0.05"] == 4 and buckets["0.25"] == 4 and buckets["0.5"] == 5
    assert buckets["+Inf"] == 6
    count = next(s.value for s in family.samples if s.name.endswith("_count"))
    assert count == 6 and abs(next(s.value for s in family.samples if s.name.endswith("_sum")) - 7.383) < 1e-9
