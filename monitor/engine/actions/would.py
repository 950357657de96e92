"""What a decision that is not carried out would have done, as its audit entry (pure).

A dry run records what would run; so does a refusal on evidence the monitor cannot attribute to
the nodes it names (``unattributed``), which is every decision on a set-up without node-bound
tokens: without the would-be command there, the recommended first week of dry run shows nothing.
The would-be command is filled through the same placeholder checks as a real one
(monitor/engine/actions/placeholders.py), so a hostile value is said to be refused, never shown as
a command; nothing here runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor.engine.actions.execute import command_line, payload
from monitor.engine.actions.policy import DRY_RUN, UNATTRIBUTED, Decision, signal_refusal
from monitor.engine.attribution import SHARED_TOKEN

UNBOUND_FIX = ("To let it act: give each node its own token (a NODE TOKEN line per node in the monitor's "
               "--token-file, HANGWATCH_TOKEN_FILE), or set trust_unbound_nodes = true in the actions file where "
               "every client that reaches the monitor is trusted.")


@dataclass(frozen=True)
class WouldBe:
    target: str  # what it would act on: the filled command line, the webhook, the signal and its ranks
    said: str  # after "would": "run: scancel -- 77", "send SIGTERM to rank 1 (pid 4242 on gpu-0412)", ...
    refused: bool = False  # a placeholder that is not data of its kind


@dataclass(frozen=True)
class AuditEntry:
    outcome: str
    target: str
    detail: str


def would_be(decision: Decision, evidence_url: str | None) -> WouldBe:
    """What the decision's rule would do on its job now, were it carried out."""
    rule = decision.rule
    if rule.kind == "command":
        argv = command_line(rule, payload(decision, evidence_url, dry_run=True))
        if isinstance(argv, list):
            line = " ".join(argv)
            return WouldBe(line, f"run: {line}")
        if argv.outcome == "refused":
            return WouldBe(rule.target, f"be refused: {argv.detail}", refused=True)
        return WouldBe(rule.target, f"skip: {argv.detail}")
    if rule.kind == "webhook":
        return WouldBe(rule.target, f"POST to {rule.webhook}")
    unsignalled = signal_refusal(rule, decision.facts)
    if unsignalled is not None:
        return WouldBe(rule.target, f"order nothing: {unsignalled}")
    ranks = ", ".join(f"rank {c.rank} (pid {c.pid} on {c.node})" for c in decision.facts.culprits if c.pid)
    return WouldBe(f"{rule.signal} to {ranks}", f"send {rule.signal} to {ranks}")


def not_carried_out(decision: Decision, evidence_url: str | None) -> AuditEntry:
    """The audit entry of a decision that runs nothing (every outcome but ACT)."""
    if decision.outcome == DRY_RUN:
        would = would_be(decision, evidence_url)
        if would.refused:
            return AuditEntry("refused", would.target, would.said.removeprefix("be refused: "))
        return AuditEntry(DRY_RUN, would.target, f"would {would.said}")
    if decision.outcome == UNATTRIBUTED and decision.evidence_unattributed:
        # Audited unattributed whatever the rule would do: the refusal is the decision.
        would = would_be(decision, evidence_url)
        fix = f" {UNBOUND_FIX}" if SHARED_TOKEN in decision.detail else ""
        return AuditEntry(UNATTRIBUTED, would.target, f"not run: {decision.detail}. The rule would {would.said}.{fix}")
    return AuditEntry(decision.outcome, decision.rule.target, decision.detail)
