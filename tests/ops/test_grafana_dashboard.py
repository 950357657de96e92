"""The Grafana dashboard's queries, run against the real Prometheus during the real hang.

Grafana is not packaged here, so the test does what Grafana would: take every panel target's
``expr``, substitute the dashboard's variables and Grafana's built-ins, and run it through
Prometheus's HTTP API. Every query must return data.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.ops.conftest import LiveHang

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "hangwatch-grafana.json"
BUILTINS = {"__rate_interval": "10s", "__interval": "2s", "__range": "5m"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows keep their panels inside
    return [p for p in out if p["type"] != "row"]


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown variable ${name} in {expr!r}"
        return values[name]

    return VARIABLE.sub(one, expr)


def test_dashboard_shape() -> None:
    d = load()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["datasource"]["uid"] == "${datasource}"
    assert variables["job"]["query"]["query"] == (
        'label_values(hangwatch_job_verdict{job="hangwatch", cluster=~"$cluster"}, job_id)')
    assert variables["cluster"]["includeAll"] and variables["cluster"]["allValue"] == ".*"
    panels = all_panels(d)
    titles = {p["title"] for p in panels}
    assert {"Jobs overview", "Verdict timeline", "CPU per rank", "Step per rank", "Time since progress",
            "Time since agent report", "Monitor up", "Monitor CPU", "Monitor memory"} <= titles
    assert {p["type"] for p in panels if p["title"] == "Verdict timeline"} == {"state-timeline"}
    ids = [p["id"] for p in d["panels"]] + [q["id"] for p in d["panels"] for q in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), p["title"]
    # Label names the monitor exports, nothing that would explode cardinality.
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    assert "pid" not in re.findall(r"\b(\w+)\s*=~?", exprs)


@pytest.mark.e2e
def test_every_panel_query_returns_data(live_hang: LiveHang) -> None:
    live = live_hang
    values = {**BUILTINS, "job": re.escape(live.job.job_id).replace("\\", "\\\\"), "datasource": "unused",
              "cluster": ".*"}
    queries = {f"{p['title']} [{t['refId']}]": substitute(t["expr"], values)
               for p in all_panels(load()) for t in p["targets"]}
    assert len(queries) >= 14
    # Some series need a few samples first (the wait ratio needs 5 stack samples per rank):
    # give the queries still empty a little longer, as a dashboard refreshing would.
    end = time.monotonic() + 30
    empty = dict(queries)
    while empty:
        empty = {name: expr for name, expr in empty.items() if not live.prometheus.query(expr)}
        if not empty or time.monotonic() > end:
            break
        time.sleep(1)
    assert not empty, ("queries with no data during a real deadlock:\n"
                       + "\n".join(f"{k}: {v}" for k, v in empty.items()) + "\n" + live.context())


@pytest.mark.e2e
def test_job_variable_lists_the_live_job(live_hang: LiveHang) -> None:
    jobs = live_hang.prometheus.api("/api/v1/label/job_id/values", **{"match[]": "hangwatch_job_verdict"})
    assert live_hang.job.job_id in jobs


@pytest.mark.e2e
def test_verdict_timeline_shows_healthy_then_deadlock(live_hang: LiveHang) -> None:
    live = live_hang
    (timeline,) = [p for p in all_panels(load()) if p["title"] == "Verdict timeline"]
    codes = {}
    for mapping in timeline["fieldConfig"]["defaults"]["mappings"]:
        for value, shown in mapping["options"].items():
            codes[shown["text"]] = float(value)
    expr = substitute(timeline["targets"][0]["expr"], {"job": re.escape(live.job.job_id).replace("\\", "\\\\"),
                                                       "cluster": ".*"})
    # The monitor said DEADLOCK at deadlock_at; Prometheus shows it after its next scrape (and rule
    # evaluation), later still on a loaded machine: ask until it does.
    deadline = time.monotonic() + 30.0
    while True:
        data = live.prometheus.api("/api/v1/query_range", query=expr, start=str(live.job.started_at),
                                   end=str(max(time.time(), live.deadlock_at + 5)), step="1s")
        (series,) = data["result"]
        seen = [float(v) for _, v in series["values"]]
        if codes["DEADLOCK"] in seen or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert series["metric"]["job_id"] == live.job.job_id
    assert codes["HEALTHY"] in seen and codes["DEADLOCK"] in seen, seen
    assert seen.index(codes["HEALTHY"]) < seen.index(codes["DEADLOCK"])
    assert set(seen) <= set(codes.values()), "every point maps to a verdict"
