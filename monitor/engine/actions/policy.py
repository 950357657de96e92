"""When a verdict becomes an action (pure): held long enough, once per incident, within the rate
limit, and only on evidence the monitor can attribute to the nodes it names.

The caller feeds every published verdict of every job (``observe``), live only (a report replayed
after an outage is history, never a reason to act now), and gets back the decisions to carry out
or to record as not taken. An incident starts when a job's published verdict becomes an incident
verdict (monitor/engine/incidents.py) and ends when it is healthy or finished again; ``unknown`` (the
monitor cannot see) neither ends it nor acts on it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from monitor.engine.actions.config import ActionConfig, ActionRule
from monitor.engine.incidents import ENDS_INCIDENT, INCIDENT_VERDICTS

ACT, DRY_RUN, RATE_LIMITED, UNATTRIBUTED = "act", "dry_run", "rate_limited", "unattributed"


@dataclass(frozen=True)
class Culprit:
    rank: int
    node: str
    pid: int | None
    started_at: float | None = None  # the process's start, so an agent can tell a reused pid
    # The id its node reported it under: the job's id or an alias of it (the node's own spelling).
    job_id: str | None = None
    # Why its node's word on which process this rank is cannot be trusted (None: it can): the node
    # reports the pid as another rank too (monitor/engine/actions/orders.py ReportedPids).
    pid_conflict: str | None = None


@dataclass(frozen=True)
class JobFacts:
    """One published verdict of one job, with what an action needs to name the job."""

    job_id: str
    verdict: str
    summary: str
    culprits: tuple[Culprit, ...] = ()
    # What people call the job (monitor/engine/job_names.py): slurm_job, k8s_namespace, k8s_pods, ...
    names: dict[str, Any] = field(default_factory=dict)
    # Why the verdict cannot be attributed to the nodes it names (None: it can): a node that
    # reports with a shared token, a rank another node claimed.
    unattributed: str | None = None


@dataclass(frozen=True)
class Decision:
    rule: ActionRule
    facts: JobFacts
    incident_started_at: float
    held_s: float
    # ACT, DRY_RUN (record what would run), RATE_LIMITED or UNATTRIBUTED (recorded, not run)
    outcome: str
    detail: str = ""
    # UNATTRIBUTED because the job's evidence cannot be attributed to its nodes (``facts.unattributed``),
    # not a signal's own check: the audit log then says what the rule would have done
    # (monitor/engine/actions/would.py), so a dry run on a set-up without node-bound tokens still shows it.
    evidence_unattributed: bool = False


@dataclass
class _Incident:
    started_at: float
    verdict: str
    verdict_since: float
    acted: set[str] = field(default_factory=set)  # rules that acted (or dry-ran) in it
    refused: set[str] = field(default_factory=set)  # rules whose refusal is already recorded


class ActionPolicy:
    def __init__(self, config: ActionConfig) -> None:
        self.config = config
        self._incidents: dict[str, _Incident] = {}
        self._recent: deque[float] = deque()  # when actions ran (or dry-ran), for the rate limit

    def observe(self, facts: JobFacts, now: float) -> list[Decision]:
        """The decisions this published verdict leads to now (most often none)."""
        verdict = facts.verdict
        incident = self._incidents.get(facts.job_id)
        if verdict in ENDS_INCIDENT:
            self._incidents.pop(facts.job_id, None)
            return []
        if verdict not in INCIDENT_VERDICTS:
            return []  # unknown: nothing to act on, and the incident goes on
        if incident is None:
            incident = self._incidents[facts.job_id] = _Incident(now, verdict, now)
        elif incident.verdict != verdict:
            incident.verdict, incident.verdict_since = verdict, now
        held_s = now - incident.verdict_since
        decisions = []
        for rule in self.config.rules:
            if verdict not in rule.verdicts or held_s < rule.after_s or rule.name in incident.acted:
                continue
            decision = self._decide(rule, facts, incident, held_s, now)
            if decision.outcome in (ACT, DRY_RUN):
                incident.acted.add(rule.name)
                self._recent.append(now)
            elif rule.name in incident.refused:
                continue  # said once; it may still act later in the incident (the limit frees up)
            else:
                incident.refused.add(rule.name)
            decisions.append(decision)
        return decisions

    def _decide(self, rule: ActionRule, facts: JobFacts, incident: _Incident, held_s: float, now: float) -> Decision:
        def decision(outcome: str, detail: str = "", evidence_unattributed: bool = False) -> Decision:
            return Decision(rule, facts, incident.started_at, held_s, outcome, detail, evidence_unattributed)

        if facts.unattributed is not None and not self.config.trust_unbound_nodes:
            return decision(UNATTRIBUTED, facts.unattributed, evidence_unattributed=True)
        while self._recent and self._recent[0] <= now - self.config.per_seconds:
            self._recent.popleft()
        if len(self._recent) >= self.config.max_actions:
            return decision(RATE_LIMITED, f"{len(self._recent)} actions in the last {self.config.per_seconds:.0f}s "
                                          f"(max_actions {self.config.max_actions})")
        unsignalled = signal_refusal(rule, facts)
        if unsignalled is not None:
            return decision(UNATTRIBUTED, unsignalled)
        return decision(DRY_RUN if self.config.dry_run else ACT)

    def keep_only(self, job_ids: set[str]) -> None:
        """Forget the incidents of jobs the monitor forgot."""
        for gone in set(self._incidents) - job_ids:
            del self._incidents[gone]

    def incident_started_at(self, job_id: str) -> float | None:
        incident = self._incidents.get(job_id)
        return incident.started_at if incident else None


def signal_refusal(rule: ActionRule, facts: JobFacts) -> str | None:
    """Why a signal rule orders nothing on these culprits (None: it may, or the rule is no signal)."""
    if rule.kind != "signal":
        return None
    if not any(c.pid for c in facts.culprits):
        return "no culprit rank with a known process to signal"
    doubted = next((c.pid_conflict for c in facts.culprits if c.pid and c.pid_conflict), None)
    if doubted is not None:
        # A node that lies about which process a rank is could aim the signal at another job's rank.
        return f"no {rule.signal} ordered: {doubted}"
    return None
