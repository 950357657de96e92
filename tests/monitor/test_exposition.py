"""The lean text-format writer: what prometheus_client's own parser reads back."""

from __future__ import annotations

import math

import pytest
from monitor_reports import rank, report
from monitor_testkit import TestClient
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor.web.exposition import Family, from_client, labels, number, render


@pytest.mark.parametrize("value", ['plain', 'quo"te', "back\\slash", "new\nline", "ünïcode", "a,b={c}"])
def test_label_values_round_trip(value: str) -> None:
    family = Family("hangwatch_test", "help with \\ and\nnewline")
    family.add(labels(("job_id", "rank"), (value, "0")), 1.5)
    [parsed] = text_string_to_metric_families(render([family]).decode())
    [sample] = parsed.samples
    assert sample.labels == {"job_id": value, "rank": "0"} and sample.value == 1.5
    assert parsed.type == "gauge"


def test_counters_get_total_and_odd_numbers_survive() -> None:
    counter = Family("hangwatch_things", "Things", "counter")
    counter.add("", 3)
    gauge = Family("hangwatch_odd", "Odd values")
    for i, v in enumerate((math.inf, -math.inf, 1e300, 0.1)):
        gauge.add(labels(("i",), (str(i),)), v)
    nan = Family("hangwatch_nan", "Not a number")
    nan.add("", math.nan)
    families = {f.name: f for f in text_string_to_metric_families(render([counter, gauge, nan]).decode())}
    assert families["hangwatch_things"].type == "counter"
    assert [s.name for s in families["hangwatch_things"].samples] == ["hangwatch_things_total"]
    assert [s.value for s in families["hangwatch_odd"].samples] == [math.inf, -math.inf, 1e300, 0.1]
    assert math.isnan(families["hangwatch_nan"].samples[0].value)
    assert number(2) == "2.0"


def test_monitor_families_are_exported(client: TestClient) -> None:
    client.post("/api/v1/reports", json=report(ranks=[rank(rank=0)]))
    client.get("/diagnose")
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    for name in ("hangwatch_monitor_reports_shed", "hangwatch_monitor_full_reports", "hangwatch_monitor_overloaded",
                 "hangwatch_monitor_event_loop_lag_seconds", "hangwatch_monitor_snapshots_written",
                 "hangwatch_monitor_ranks", "hangwatch_monitor_store_backlog"):
        assert name in families, name
    assert families["hangwatch_monitor_full_reports"].samples[0].value == 1.0
    assert families["hangwatch_monitor_ranks"].samples[0].value == 1.0
    assert families["hangwatch_monitor_overloaded"].samples[0].value == 0.0


def test_stock_collector_families_render_as_the_client_renders_them() -> None:
    """from_client: a prometheus_client family goes through this writer and reads back the same."""
    registry = CollectorRegistry()
    Counter("demo_events", "Events", ["kind"], registry=registry).labels(kind='a"b').inc(3)
    Gauge("demo_level", "Level", registry=registry).set(0.5)
    ours = render([f for m in registry.collect() for f in from_client(m)]).decode()
    theirs = generate_latest(registry).decode()

    def parsed(text: str) -> list[tuple[str, str, list]]:
        return [(f.name, f.type, [(s.name, s.labels, s.value) for s in f.samples])
                for f in text_string_to_metric_families(text)]

    assert parsed(ours) == parsed(theirs)
    assert "demo_events_total{kind=\"a\\\"b\"} 3.0" in ours
