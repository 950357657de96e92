"""Where the status page links to: the job's Grafana dashboard and the runbook section for its verdict;
and how it draws each verdict (the verdict catalogue's colours and labels).

The addresses come from the monitor's settings (``--grafana-url``, ``--runbook-url``: by default the
monitor's own ``/runbook``) and reach the page in the ``monitor`` part of every
``/diagnose?format=json`` answer; the page fills in the job.
"""

from __future__ import annotations

from typing import Any

# RUNBOOK_SECTIONS: verdict -> its section of docs/runbook.md (the anchors alerts link to as well).
# A job the monitor cannot see ("unknown") is the agent-silent case; healthy and finished have none.
from monitor.diagnosis.verdict_catalogue import CATALOGUE, RUNBOOK_SECTIONS as RUNBOOK_SECTIONS
from monitor.web.settings import Settings

# Verdict -> how the page draws it: its colour (a class of style.css) and its label.
VERDICT_LOOKS = {v.name: {"tone": v.colour.page, "label": v.label} for v in CATALOGUE}


def page_links(settings: Settings) -> dict[str, Any]:
    return {
        "grafana": settings.grafana_url,
        "runbook": settings.runbook_url,
        "runbook_sections": RUNBOOK_SECTIONS,
        "verdicts": VERDICT_LOOKS,
    }
