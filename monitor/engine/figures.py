"""Copies of live counters for ``MonitorFigures`` (monitor/engine/published.py), made under the
engine's lock by ``Monitor.figures``."""

from __future__ import annotations

from collections.abc import Mapping

from monitor.engine.capture_requests import CaptureRequests
from monitor.engine.published import CaptureFigures, NodeSummary
from monitor.ingest.tracks import NodeTrack


def node_summaries(nodes: Mapping[str, NodeTrack]) -> list[NodeSummary]:
    """Each node's agent as its last report showed it, by node name."""
    return [
        NodeSummary(
            n.node,
            n.last_report_at,
            tuple((c.name, c.ok) for c in n.collectors),
            tuple(sorted(n.collector_errors.items())),
            n.stack_failures,
            n.agent.cpu_percent if n.agent else None,
            n.agent.rss_bytes if n.agent else None,
        )
        for n in sorted(nodes.values(), key=lambda n: n.node)
    ]


def capture_figures(captures: CaptureRequests | None) -> CaptureFigures | None:
    if captures is None:
        return None
    store = captures.store
    return CaptureFigures(captures.requested, store.parts_received, store.parts_refused, store.total_bytes,
                          tuple(sorted(store.refusals.items())))
