"""The verdict catalogue (monitor/diagnosis/verdict_catalogue.py), table-style: the rules return exactly
its verdicts, each entry holds together, and every place that names verdicts follows it, one row per
place (what it holds, what the catalogue says): the code, the page, the terminal, the generated
mixin and the docs. No processes."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import hangwatch.cli
from hangwatch import colour
from monitor import diagnosis
from monitor.diagnosis import stability
from monitor.diagnosis.verdict_catalogue import CATALOGUE, COLOURS, VerdictEntry
from monitor.engine import incidents
from monitor.present import answers, job_answer
from monitor.web import page_links

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "monitor" / "web" / "static"
# The numbers the mixin's recording rule gives the verdicts are kept in Prometheus: never renumbered.
STORED_CODES = ("healthy", "finished", "straggler", "slow_compute", "stalled", "rendezvous_hang", "rank_stopped",
                "rank_exited", "deadlock", "unknown")


def names(keep: Callable[[VerdictEntry], object] = lambda v: True) -> frozenset[str]:
    return frozenset(v.name for v in CATALOGUE if keep(v))


def returned_verdicts() -> set[str]:
    """The verdict of every diagnosis the rules write out: ``ctx.diagnosis("deadlock", ...)``,
    ``Diagnosis("healthy", ...)``, ``verdict="..."``."""
    found = set()
    for path in (ROOT / "monitor" / "diagnosis").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            args = node.args[:1] if called in ("diagnosis", "Diagnosis") else []
            args += [k.value for k in node.keywords if k.arg == "verdict"]
            found |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return found


def test_the_rules_return_exactly_the_catalogues_verdicts() -> None:
    assert returned_verdicts() == names()
    assert len(CATALOGUE) == len(names())


def test_stored_codes_never_move() -> None:
    assert tuple(v.name for v in CATALOGUE[:len(STORED_CODES)]) == STORED_CODES


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda v: v.name)
def test_entry_holds_together(entry: VerdictEntry) -> None:
    assert re.fullmatch(r"[a-z]+(_[a-z]+)*", entry.name) and entry.label.strip()
    assert entry.severity in COLOURS
    if entry.confirm_s is not None:  # an alarm is trouble: it opens an incident
        assert entry.confirm_s > 0 and entry.incident and entry.severity != "ok"
    if entry.severity == "ok":  # nothing to do: no incident, no alert, no runbook section
        assert not entry.incident and entry.runbook is None
    else:
        assert entry.runbook and re.fullmatch(r"[a-z0-9-]+", entry.runbook)


def test_each_face_tells_the_severities_apart() -> None:
    for face in ("grafana", "page", "terminal"):
        assert len({getattr(c, face) for c in COLOURS.values()}) == len(COLOURS), face


def _mixin_verdicts() -> list[dict]:
    text = (ROOT / "dashboards" / "mixin" / "verdicts.libsonnet").read_text()
    return json.loads("\n".join(line for line in text.splitlines() if not line.startswith("//")))


def _grafana_mappings() -> list[dict]:
    """Every value mapping of the dashboard that shows verdicts, as {code: (text, colour)}."""
    dashboard = json.loads((ROOT / "dashboards" / "hangwatch-grafana.json").read_text())
    found = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            options = [m["options"] for m in value if isinstance(m, dict) and m.get("type") == "value"]
            if any(o.get("text") == "HEALTHY" for opts in options for o in opts.values()):
                found.append({k: (o["text"], o["color"]) for opts in options for k, o in opts.items()})
            for v in value:
                walk(v)

    walk(dashboard)
    assert len(found) >= 2  # the jobs table and the verdict timeline
    return found


def _rules(path: str) -> list[dict]:
    return [r for g in yaml.safe_load((ROOT / path).read_text())["groups"] for r in g["rules"]]


def _job_alerts() -> dict[str, tuple[str, str]]:
    """Verdict -> (severity, runbook section) of the alert on it."""
    out = {}
    for alert in _rules("dashboards/hangwatch-alerts.yml"):
        found = re.search(r'hangwatch_job_verdict\{[^}]*verdict="(\w+)"', alert.get("expr", ""))
        if found:
            out[found.group(1)] = (alert["labels"]["severity"], alert["annotations"]["runbook_url"].rsplit("#", 1)[1])
    return out


def _pace_alert_quiet_verdicts() -> set[str]:
    """The verdicts under which HangwatchJobSlow stays quiet (its `unless` matcher)."""
    (alert,) = [a for a in _rules("dashboards/hangwatch-alerts.yml") if a.get("alert") == "HangwatchJobSlow"]
    return set(re.search(r'unless on .*verdict=~"([\w|]+)"', alert["expr"]).group(1).split("|"))


def _recorded_codes() -> dict[str, int]:
    (rule,) = [r for r in _rules("dashboards/hangwatch-rules.yml") if r.get("record") == "job_id:hangwatch_job_verdict:code"]
    return {v: int(code) for v, code in re.findall(r'verdict="(\w+)"\} == 1\) \* (\d+)', rule["expr"])}


def _painted(verdict: str) -> tuple[str, str]:
    """How the terminal shows a verdict: in the status table, and in the text report."""
    word = verdict.upper()
    return colour.paint_verdict(word, verdict, True), colour.paint_verdicts_in(f"JOB a  {word}", True)


def _readme_verdicts() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Verdicts\n"):text.index("Verdicts are meant to be paged on.")]
    return dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", section, re.MULTILINE))


def _readme_alarms() -> tuple[frozenset[str], set[float]]:
    found = re.search(r"An alarm \(([^)]*)\) is published only once the raw readings have named it for ([\d.]+) s"
                      r"(?:\s+over\s+two\s+readings\s+\(([\d.]+) s for `\w+`)?", (ROOT / "README.md").read_text())
    assert found
    return (frozenset(re.findall(r"`(\w+)`", found.group(1))),
            {float(g) for g in found.group(2, 3) if g is not None})


def _runbook_anchors() -> set[str]:
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "runbook.md").read_text(), re.MULTILINE)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}


def _failure_verdicts() -> set[str]:
    """The verdicts docs/failures.md gives for its failures (its third column)."""
    rows = [line.split(" | ") for line in (ROOT / "docs" / "failures.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| failure")]
    return {w for row in rows for w in re.findall(r"`([a-z_]+)`", row[2])}


def _page_classes() -> set[str]:
    """The tones style.css draws a verdict's badge, card, history and progress marker in."""
    css = (STATIC / "style.css").read_text()
    kinds = (r"\.verdict\.", r"\.job\.", r"\.history \.seg\.", r"svg\.progress \.since\.")
    return set.intersection(*(set(re.findall(kind + r"([a-z]+) \{", css)) for kind in kinds))


# Each place that names verdicts: (what it holds, what the catalogue says it should hold).
PLACES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "monitor.diagnosis.VERDICTS": (lambda: diagnosis.VERDICTS, lambda: tuple(v.name for v in CATALOGUE)),
    "stability.CONFIRM_S (alarms)": (
        lambda: stability.CONFIRM_S, lambda: {v.name: v.confirm_s for v in CATALOGUE if v.confirm_s is not None}),
    "stability.ALARMS": (lambda: stability.ALARMS, lambda: names(lambda v: v.confirm_s is not None)),
    "incidents.INCIDENT_VERDICTS": (lambda: incidents.INCIDENT_VERDICTS, lambda: names(lambda v: v.incident)),
    "incidents.ENDS_INCIDENT": (lambda: incidents.ENDS_INCIDENT, lambda: names(lambda v: v.severity == "ok")),
    "answers.QUIET_VERDICTS (?problems=1)": (lambda: answers.QUIET_VERDICTS, lambda: names(lambda v: v.severity == "ok")),
    "job_answer.NO_STACK_TREE": (lambda: job_answer.NO_STACK_TREE, lambda: names(lambda v: v.severity == "ok")),
    "hangwatch.cli.OK_VERDICTS (exit 0)": (lambda: hangwatch.cli.OK_VERDICTS, lambda: names(lambda v: v.severity == "ok")),
    "page_links.RUNBOOK_SECTIONS": (
        lambda: page_links.RUNBOOK_SECTIONS, lambda: {v.name: v.runbook for v in CATALOGUE if v.runbook}),
    "the page's colours and labels (monitor.links.verdicts)": (
        lambda: page_links.VERDICT_LOOKS, lambda: {v.name: {"tone": v.colour.page, "label": v.label} for v in CATALOGUE}),
    "style.css draws every page tone": (lambda: {c.page for c in COLOURS.values()} - _page_classes(), set),
    "app.js keeps no verdict table of its own": (
        lambda: re.findall(r"\b(%s)\s*:" % "|".join(names()), (STATIC / "app.js").read_text()), list),
    "the terminal's colours": (
        lambda: {v.name: _painted(v.name) for v in CATALOGUE},
        lambda: {v.name: (f"\033[{v.colour.terminal}m{v.name.upper()}\033[0m",
                          f"JOB a  \033[{v.colour.terminal}m{v.name.upper()}\033[0m") for v in CATALOGUE}),
    "dashboards/mixin/verdicts.libsonnet": (
        _mixin_verdicts, lambda: [{"name": v.name, "label": v.label, "severity": v.severity, "colour": v.colour.grafana,
                                   "runbook": v.runbook, "halts": v.halts} for v in CATALOGUE]),
    "the pace alert's quiet verdicts (HangwatchJobSlow)": (_pace_alert_quiet_verdicts, lambda: names(lambda v: v.halts)),
    "the dashboard's verdict mappings": (
        _grafana_mappings,
        lambda: [{str(i): (v.label.upper(), v.colour.grafana) for i, v in enumerate(CATALOGUE)}] * len(_grafana_mappings())),
    "the recording rule's verdict codes": (_recorded_codes, lambda: {v.name: i for i, v in enumerate(CATALOGUE)}),
    "the alerts' severities and runbook sections": (
        _job_alerts, lambda: {v.name: (v.severity, v.runbook) for v in CATALOGUE if v.severity != "ok"}),
    "README's Verdicts table": (_readme_verdicts, lambda: {v.name: v.severity for v in CATALOGUE}),
    "README's alarms and their confirmation": (
        _readme_alarms, lambda: (names(lambda v: v.confirm_s is not None), {v.confirm_s for v in CATALOGUE if v.confirm_s})),
    "docs/runbook.md has each verdict's section": (
        lambda: {v.runbook for v in CATALOGUE if v.runbook} - _runbook_anchors(), set),
    "docs/failures.md gives every trouble verdict, and only verdicts": (
        lambda: (_failure_verdicts() - names(), names(lambda v: v.severity != "ok") - _failure_verdicts()),
        lambda: (set(), set())),
}


@pytest.mark.parametrize("place", PLACES)
def test_every_place_follows_the_catalogue(place: str) -> None:
    holds, should = PLACES[place]
    assert holds() == should()
