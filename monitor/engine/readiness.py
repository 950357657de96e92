"""Whether the monitor is ready for traffic: /readyz, ``hangwatch_monitor_ready`` and systemd's ``STATUS=``
all follow ``decide``, a pure function of facts its parts publish.

Not ready, each reason named (``REASONS``):

- ``store_not_writable``: the database failed its last write, or could not be opened at all
  (monitor/storage/store.py); history is held in memory meanwhile.
- ``volume_nearly_full``: the database's or the captures' volume has less than ``min_free_bytes``
  free; snapshots or capture parts are refused meanwhile (monitor/storage/free_space.py).
- ``shedding_load``: the event loop runs past ``shed_lag_s`` behind, and reports are shed
  (monitor/web/load.py).
- ``rebuilding``: after a restart, until every node restored from the stored snapshots has sent
  a full report again, and for ``job_room_silent_s`` at most (a node that never comes back does
  not hold readiness back for longer; it is the time the monitor listens after a restart before
  silence means anything, monitor/engine/service.py).

None of them stops the monitor from taking reports: a not-ready monitor still wants every agent's
report (a rebuild ends only when the restored nodes report), so an orchestrator should keep
sending it traffic (Kubernetes: ``publishNotReadyAddresses`` on the agents' Service).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from monitor.storage.free_space import VolumeSpace, mib

REASONS = ("store_not_writable", "volume_nearly_full", "shedding_load", "rebuilding")
# What each volume's shortage stops.
_REFUSED = {"store": "snapshots", "captures": "capture parts"}


@dataclass(frozen=True)
class NotReady:
    reason: str  # one of REASONS
    title: str  # a few steady words (systemd's STATUS=)
    detail: str  # with the figures of the moment


@dataclass(frozen=True)
class RebuildProgress:
    """The nodes restored from the store at start, those not heard from in full since, and how
    long the rebuild may still hold readiness back."""

    restored_nodes: int
    waiting_nodes: int
    left_s: float


@dataclass(frozen=True)
class Readiness:
    reasons: tuple[NotReady, ...]
    volumes: tuple[VolumeSpace, ...] = ()

    @property
    def ready(self) -> bool:
        return not self.reasons

    def answer(self) -> dict:
        """/readyz's body (no paths: it is open to anyone who reaches the monitor)."""
        return {"ready": self.ready,
                "reasons": [{"reason": r.reason, "detail": r.detail} for r in self.reasons],
                "volumes": [{"volume": v.name, "free_bytes": v.free_bytes, "min_free_bytes": v.min_free_bytes}
                            for v in self.volumes]}

    def status_line(self) -> str:
        """systemd's STATUS= text: steady while nothing changes, so it is sent only on a change."""
        return "ready" if self.ready else "not ready: " + "; ".join(r.title for r in self.reasons)


def decide(store_problem: str | None, volumes: Sequence[VolumeSpace], overloaded: bool,
           rebuild: RebuildProgress | None) -> Readiness:
    """``store_problem``: why the database does not take writes, None while it does."""
    reasons = []
    if store_problem is not None:
        reasons.append(NotReady("store_not_writable", f"store not writable ({store_problem.split(':')[0]})",
                                f"the database does not take writes ({store_problem}); history is held in memory"))
    for volume in volumes:
        if volume.short:
            refused = _REFUSED.get(volume.name, "writes")
            reasons.append(NotReady("volume_nearly_full", f"{volume.name} volume nearly full",
                                    f"the {volume.name} volume has {mib(volume.free_bytes)} free, under "
                                    f"min_free_bytes ({mib(volume.min_free_bytes)}): {refused} are refused"))
    if overloaded:
        reasons.append(NotReady("shedding_load", "shedding load",
                                "the event loop runs further behind than shed_lag_s: reports from nodes heard "
                                "from recently are refused with 503 and Retry-After"))
    if rebuild is not None:
        reasons.append(NotReady("rebuilding", "rebuilding after a restart",
                                f"{rebuild.waiting_nodes} of {rebuild.restored_nodes} nodes restored from the store "
                                f"have not sent a full report since the restart (ready in {rebuild.left_s:.0f} s "
                                "at most)"))
    return Readiness(tuple(reasons), tuple(volumes))
