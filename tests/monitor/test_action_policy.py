"""When a published verdict becomes an action (monitor/engine/actions/policy.py): table tests, no I/O."""

from __future__ import annotations

import pytest

from monitor.engine.actions.config import ActionConfig, ActionRule
from monitor.engine.actions.policy import ACT, DRY_RUN, RATE_LIMITED, UNATTRIBUTED, ActionPolicy, Culprit, JobFacts

CANCEL = ActionRule("cancel", frozenset({"deadlock", "stalled"}), 10.0, "command", command=("scancel", "{slurm_job}"))
SIGNAL = ActionRule("restart", frozenset({"deadlock"}), 5.0, "signal", signal="SIGTERM")
CULPRIT = (Culprit(1, "node-b", 4242, 100.0),)


def facts(verdict: str, job: str = "job-a", unattributed: str | None = None, culprits=CULPRIT) -> JobFacts:
    return JobFacts(job, verdict, f"a {verdict}", culprits, {"slurm_job": "77"}, unattributed)


def run(policy: ActionPolicy, readings: list[tuple[float, JobFacts]]) -> list[tuple[float, str, str, str]]:
    """(time, job, rule, outcome) of every decision over the readings."""
    return [(now, d.facts.job_id, d.rule.name, d.outcome)
            for now, f in readings for d in policy.observe(f, now)]


def config(*rules: ActionRule, **options) -> ActionConfig:
    return ActionConfig(rules, **{"dry_run": False, **options})


@pytest.mark.parametrize(("name", "cfg", "readings", "expected"), [
    ("acts once the verdict held after_s, once per incident",
     config(CANCEL), [(t, facts("deadlock")) for t in range(0, 30)], [(10, "job-a", "cancel", ACT)]),
    ("a verdict that clears before after_s never acts",
     config(CANCEL), [(0, facts("deadlock")), (8, facts("deadlock")), (9, facts("healthy")), (19, facts("healthy"))],
     []),
    ("healthy ends the incident: the next one acts again",
     config(CANCEL), [(0, facts("deadlock")), (10, facts("deadlock")), (11, facts("healthy")),
                      (20, facts("deadlock")), (30, facts("deadlock"))],
     [(10, "job-a", "cancel", ACT), (30, "job-a", "cancel", ACT)]),
    ("unknown neither ends the incident nor acts",
     config(CANCEL), [(0, facts("deadlock")), (10, facts("deadlock")), (11, facts("unknown")), (25, facts("deadlock"))],
     [(10, "job-a", "cancel", ACT)]),
    ("the time held restarts when the verdict changes within the incident",
     config(SIGNAL), [(0, facts("stalled")), (4, facts("deadlock")), (8, facts("deadlock")), (9, facts("deadlock"))],
     [(9, "job-a", "restart", ACT)]),
    ("a verdict the rule does not name never acts",
     config(SIGNAL), [(0, facts("straggler")), (60, facts("straggler"))], []),
    ("dry run decides the same, runs nothing",
     config(CANCEL, dry_run=True), [(0, facts("deadlock")), (10, facts("deadlock")), (20, facts("deadlock"))],
     [(10, "job-a", "cancel", DRY_RUN)]),
    ("evidence from a node another client could speak for: refused, said once",
     config(CANCEL), [(0, facts("deadlock", unattributed="shared token")), (10, facts("deadlock", unattributed="x")),
                      (11, facts("deadlock", unattributed="x"))],
     [(10, "job-a", "cancel", UNATTRIBUTED)]),
    ("... and acts once it can be attributed, within the same incident",
     config(CANCEL), [(0, facts("deadlock", unattributed="x")), (10, facts("deadlock", unattributed="x")),
                      (12, facts("deadlock"))],
     [(10, "job-a", "cancel", UNATTRIBUTED), (12, "job-a", "cancel", ACT)]),
    ("trust_unbound_nodes acts on such evidence",
     config(CANCEL, trust_unbound_nodes=True), [(0, facts("deadlock", unattributed="x")),
                                                (10, facts("deadlock", unattributed="x"))],
     [(10, "job-a", "cancel", ACT)]),
    ("a signal with no live culprit process is not sent",
     config(SIGNAL), [(0, facts("deadlock", culprits=(Culprit(1, "node-b", None),))),
                      (5, facts("deadlock", culprits=(Culprit(1, "node-b", None),)))],
     [(5, "job-a", "restart", UNATTRIBUTED)]),
    ("the global rate limit holds a fleet-wide fault to max_actions, the rest said once and acted on later",
     config(CANCEL, max_actions=2, per_seconds=100),
     [(t, facts("deadlock", job=j)) for t in (0, 10, 11) for j in ("a", "b", "c")] + [(111, facts("deadlock", job="c"))],
     [(10, "a", "cancel", ACT), (10, "b", "cancel", ACT), (10, "c", "cancel", RATE_LIMITED),
      (111, "c", "cancel", ACT)]),
    ("two rules act independently, each once",
     config(CANCEL, SIGNAL), [(t, facts("deadlock")) for t in range(0, 15)],
     [(5, "job-a", "restart", ACT), (10, "job-a", "cancel", ACT)]),
])
def test_decisions(name: str, cfg: ActionConfig, readings, expected) -> None:
    assert run(ActionPolicy(cfg), readings) == expected, name


def test_a_forgotten_job_starts_a_new_incident() -> None:
    policy = ActionPolicy(config(CANCEL))
    assert run(policy, [(0, facts("deadlock")), (10, facts("deadlock"))]) == [(10, "job-a", "cancel", ACT)]
    policy.keep_only(set())
    assert policy.incident_started_at("job-a") is None
    assert run(policy, [(20, facts("deadlock")), (30, facts("deadlock"))]) == [(30, "job-a", "cancel", ACT)]
