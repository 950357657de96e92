"""Every verdict in one table: its name, how bad it is, how long it must last before it is published,
whether it makes an incident, its runbook section, its label and its colour.

Everything else follows this table. The rules' ``VERDICTS``, the alarm confirmation
(``stability``), incidents (``monitor.engine.incidents``), the page's colours and runbook links
(``monitor.web.page_links``), the metrics and the terminal's colours (``hangwatch/colour.py``) read
it; ``scripts/build-mixin.py`` writes it into the monitoring mixin
(``dashboards/mixin/verdicts.libsonnet``: the alerts' severities and runbook links, the
dashboard's colours). ``tests/diagnosis/test_verdict_catalogue.py`` checks the docs against it.
Adding a verdict: a row here, the rule that returns it, its docs (the README's Verdicts table,
docs/failures.md, its docs/runbook.md section), then ``scripts/build-mixin.py``; one that is
trouble also wants its alert's words (dashboards/mixin/alerts.libsonnet) and a promtool test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# ok: nothing to do; warning and critical: an alert of that severity (the mixin's label).
Severity = Literal["ok", "warning", "critical"]


@dataclass(frozen=True)
class Colour:
    """One colour as each face draws it."""

    grafana: str  # Grafana's colour name
    page: str  # the status page's class (monitor/web/static/style.css)
    terminal: str  # the ANSI SGR code


# One colour per severity, so a verdict looks as bad on the terminal, the page and Grafana.
COLOURS: dict[str, Colour] = {
    "ok": Colour("green", "ok", "32"),
    "warning": Colour("orange", "warn", "33"),
    "critical": Colour("red", "bad", "1;31"),
}


@dataclass(frozen=True)
class VerdictEntry:
    name: str
    severity: Severity
    label: str
    # An alarm: published once the raw verdicts have named it this long (stability.settle). None:
    # published at once (a fact confirmed upstream, or no trouble).
    confirm_s: float | None = None
    # Opens (or continues) an incident. A verdict of severity ok ends one; the others do neither.
    incident: bool = False
    # Its section of docs/runbook.md (the anchor alerts and the page link to).
    runbook: str | None = None
    # The job makes no progress under it (or the monitor cannot see it): its own alert says so, and
    # the pace alert (HangwatchJobSlow, for jobs that still step, slowly) stays quiet beside it.
    halts: bool = False

    @property
    def colour(self) -> Colour:
        return COLOURS[self.severity]


# In the order of the numbers the mixin's recording rule gives them (job_id:hangwatch_job_verdict:code):
# kept in Prometheus, so a new verdict goes last. Each: name, severity, label, confirm_s, incident, runbook, halts.
CATALOGUE: tuple[VerdictEntry, ...] = (
    VerdictEntry("healthy", "ok", "healthy"),
    VerdictEntry("finished", "ok", "finished"),
    VerdictEntry("straggler", "warning", "straggler", 1.0, True, "straggler"),
    VerdictEntry("slow_compute", "warning", "slow compute", 1.0, True, "slow-compute"),
    VerdictEntry("stalled", "warning", "stalled", 1.0, True, "stalled", halts=True),
    VerdictEntry("rendezvous_hang", "critical", "rendezvous hang", 1.0, True, "rendezvous-hang", halts=True),
    VerdictEntry("rank_stopped", "critical", "rank stopped", None, True, "rank-stopped", halts=True),
    VerdictEntry("rank_exited", "critical", "rank exited", None, True, "rank-exited", halts=True),
    VerdictEntry("deadlock", "critical", "deadlock", 1.0, True, "deadlock", halts=True),
    # The monitor cannot tell: the agent of a node running the job has gone silent (or the
    # monitor has just restarted and waits for fresh reports).
    VerdictEntry("unknown", "warning", "unknown", None, False, "agent-silent", halts=True),
    # Still stepping, at a third of its own pace or less, its ranks waiting on the network: confirmed
    # over several slow readings, since a single slow step is no trend.
    VerdictEntry("slow_network", "warning", "slow network", 10.0, True, "slow-network"),
)

BY_NAME: dict[str, VerdictEntry] = {v.name: v for v in CATALOGUE}
VERDICTS: tuple[str, ...] = tuple(BY_NAME)
# Alarms and how long each must last in the raw verdicts before it is published.
CONFIRM_S: dict[str, float] = {v.name: v.confirm_s for v in CATALOGUE if v.confirm_s is not None}
ALARMS = frozenset(CONFIRM_S)
# No problem: no alert, `hangwatch` exits 0, no stack tree, left out of ?problems=1; ends an incident.
QUIET = frozenset(v.name for v in CATALOGUE if v.severity == "ok")
INCIDENT_VERDICTS = frozenset(v.name for v in CATALOGUE if v.incident)
RUNBOOK_SECTIONS: dict[str, str] = {v.name: v.runbook for v in CATALOGUE if v.runbook is not None}
