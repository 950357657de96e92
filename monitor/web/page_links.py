"""Where the status page links to: the job's Grafana dashboard and the runbook section for its verdict.

The addresses come from the monitor's settings (``--grafana-url``, ``--runbook-url``) and reach the
page in the ``monitor`` part of every ``/diagnose?format=json`` answer; the page fills in the job.
"""

from __future__ import annotations

from typing import Any

from monitor.web.settings import Settings

# Verdict -> its section of docs/runbook.md (the anchors alerts link to as well). A job the
# monitor cannot see ("unknown") is the agent-silent case; healthy and finished have none.
RUNBOOK_SECTIONS = {
    "deadlock": "deadlock",
    "rank_exited": "rank-exited",
    "rank_stopped": "rank-stopped",
    "straggler": "straggler",
    "rendezvous_hang": "rendezvous-hang",
    "slow_compute": "slow-compute",
    "stalled": "stalled",
    "unknown": "agent-silent",
}


def page_links(settings: Settings) -> dict[str, Any]:
    return {
        "grafana": settings.grafana_url,
        "runbook": settings.runbook_url,
        "runbook_sections": RUNBOOK_SECTIONS if settings.runbook_url else {},
    }
