"""When a published verdict becomes an action (monitor/engine/actions/policy.py): table tests, no I/O."""

from __future__ import annotations

import pytest

from monitor.engine.actions.config import ActionConfig, ActionRule
from monitor.engine.actions.policy import ACT, DRY_RUN, RATE_LIMITED, UNATTRIBUTED, ActionPolicy, Culprit, JobFacts
from monitor.engine.actions.would import UNBOUND_FIX, not_carried_out

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


# What an unattributed decision's audit entry says the rule would have done: the would-be command
# filled through the placeholder checks (monitor/engine/actions/would.py), never run.
SHARED = "node node-b reports with a shared token (or none): another client could have spoken for it"
CLAIMED = "node node-c claimed rank 1, which node node-b holds: the job's evidence may not come from the nodes it names"
HOOK = ActionRule("chat", frozenset({"deadlock"}), 0.0, "webhook", webhook="https://chat.example/hook")
DOUBTED = (Culprit(1, "node-b", 4242, 100.0, pid_conflict="node node-b reports pid 4242 as two ranks"),)


@pytest.mark.parametrize(("name", "cfg", "names", "why", "culprits", "expected"), [
    ("unattributed, dry run (the first week on a set-up without node-bound tokens): the filled command it would run",
     config(CANCEL, dry_run=True), {"slurm_job": "77"}, SHARED, CULPRIT,
     (UNATTRIBUTED, "scancel 77", f"not run: {SHARED}. The rule would run: scancel 77. {UNBOUND_FIX}")),
    ("... the same with dry_run off: the refusal is the decision",
     config(CANCEL), {"slurm_job": "77"}, SHARED, CULPRIT,
     (UNATTRIBUTED, "scancel 77", f"not run: {SHARED}. The rule would run: scancel 77. {UNBOUND_FIX}")),
    ("a hostile placeholder value still refuses: no command line is shown",
     config(CANCEL, dry_run=True), {"slurm_job": "--user=root"}, SHARED, CULPRIT,
     (UNATTRIBUTED, "scancel {slurm_job}", f"not run: {SHARED}. The rule would be refused: {{slurm_job}} is "
      "'--user=root', not a Slurm job id (digits, _task, .step): refused (a placeholder is data, never an option). "
      f"{UNBOUND_FIX}")),
    ("a job with no value for a placeholder: it would skip",
     config(CANCEL, dry_run=True), {}, SHARED, CULPRIT,
     (UNATTRIBUTED, "scancel {slurm_job}", f"not run: {SHARED}. The rule would skip: the job has no slurm_job for "
      f"'{{slurm_job}}'. {UNBOUND_FIX}")),
    ("a signal: the ranks it would be sent to",
     config(SIGNAL, dry_run=True), {}, SHARED, CULPRIT,
     (UNATTRIBUTED, "SIGTERM to rank 1 (pid 4242 on node-b)",
      f"not run: {SHARED}. The rule would send SIGTERM to rank 1 (pid 4242 on node-b). {UNBOUND_FIX}")),
    ("a signal on a pid its node doubts: it would order nothing",
     config(SIGNAL, dry_run=True), {}, SHARED, DOUBTED,
     (UNATTRIBUTED, "SIGTERM to the culprit ranks", f"not run: {SHARED}. The rule would order nothing: no SIGTERM "
      f"ordered: node node-b reports pid 4242 as two ranks. {UNBOUND_FIX}")),
    ("a webhook: where it would POST",
     config(HOOK, dry_run=True), {}, SHARED, CULPRIT,
     (UNATTRIBUTED, "https://chat.example/hook",
      f"not run: {SHARED}. The rule would POST to https://chat.example/hook. {UNBOUND_FIX}")),
    ("a claimed rank is no token matter: no token fix offered",
     config(CANCEL, dry_run=True), {"slurm_job": "77"}, CLAIMED, CULPRIT,
     (UNATTRIBUTED, "scancel 77", f"not run: {CLAIMED}. The rule would run: scancel 77.")),
    ("attributed, dry run: what would run",
     config(CANCEL, dry_run=True), {"slurm_job": "77"}, None, CULPRIT, (DRY_RUN, "scancel 77", "would run: scancel 77")),
    ("attributed, dry run, hostile value: refused",
     config(CANCEL, dry_run=True), {"slurm_job": "--user=root"}, None, CULPRIT,
     ("refused", "scancel {slurm_job}", "{slurm_job} is '--user=root', not a Slurm job id (digits, _task, .step): "
      "refused (a placeholder is data, never an option)")),
    ("a signal's own check keeps its line",
     config(SIGNAL, dry_run=True), {}, None, DOUBTED,
     (UNATTRIBUTED, "SIGTERM to the culprit ranks", "no SIGTERM ordered: node node-b reports pid 4242 as two ranks")),
])
def test_what_a_decision_that_runs_nothing_records(name: str, cfg: ActionConfig, names: dict, why: str | None,
                                                   culprits, expected: tuple[str, str, str]) -> None:
    job = JobFacts("job-a", "deadlock", "a deadlock", culprits, names, why)
    policy = ActionPolicy(cfg)
    [decision] = [d for now in (0, 60) for d in policy.observe(job, now)]
    assert decision.outcome != ACT, name
    entry = not_carried_out(decision, None)
    assert (entry.outcome, entry.target, entry.detail) == expected, name
