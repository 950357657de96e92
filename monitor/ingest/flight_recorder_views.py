"""A rank's Flight Recorder dump as the diagnosis sees it: the report's times on the monitor's clock."""

from __future__ import annotations

from monitor.diagnosis.model import FlightRecord, FrEntry, FrGroup
from monitor.ingest.wire import FlightRecorderReport


def flight_record(report: FlightRecorderReport, offset: float) -> FlightRecord:
    """``offset``: what to add to the agent's clock (the rank's node's clock) for the monitor's."""
    return FlightRecord(
        dumped_at=report.dumped_at + offset,
        path=report.path,
        status=report.status,
        groups=tuple(
            FrGroup(
                pg=g.pg, desc=g.desc, size=g.size,
                last_enqueued=g.last_enqueued, last_started=g.last_started, last_completed=g.last_completed,
                recent=tuple(
                    FrEntry(e.seq, e.op, e.state, e.created_at + offset if e.created_at is not None else None, e.p2p)
                    for e in g.recent
                ),
            )
            for g in report.groups
        ),
    )
