"""Opt-in actions, end to end inside the monitor: published verdicts in (``observe``, from the
diagnosis pass), decisions carried out off the pass (``run_pending``, on the event loop), and
every decision with its outcome in the audit log (the store's ``actions`` table, the monitor's
log, ``hangwatch_actions_total``)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monitor.engine.actions.config import ActionConfig
from monitor.engine.actions.execute import NotRun, command_line, payload, post_webhook, run_command
from monitor.engine.actions.orders import AgentOrders
from monitor.engine.actions.policy import ACT, ActionPolicy, Decision, JobFacts
from monitor.engine.actions.would import not_carried_out
from monitor.storage.store import ActionRecord, Store

if TYPE_CHECKING:  # the client is made where actions are carried out (monitor/web/app.py)
    import httpx

log = logging.getLogger("hangwatch.actions")
RAN = ("ok", "failed")  # the outcomes of an action carried out
RECENT_KEPT = 256  # audit entries kept in memory too (the database may be failing)


class ActionEngine:
    def __init__(self, config: ActionConfig, store: Store, orders: AgentOrders,
                 clock: Callable[[], float] = time.time, page_url: str | None = None) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.policy = ActionPolicy(config)
        self.orders = orders  # the monitor's, shared with evidence captures
        # The evidence link an action carries: evidence_url, else this monitor's page (when known).
        self.page_url = page_url
        self.verdicts = config.verdicts
        self._queue: collections.deque[Decision] = collections.deque()
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str, str], int] = {}  # (rule, kind, outcome) -> actions
        self.recent: collections.deque[ActionRecord] = collections.deque(maxlen=RECENT_KEPT)
        self._signals: dict[int, tuple[Decision, str]] = {}
        self._signal_ids = iter(range(1, 1 << 62))

    def observe(self, facts: JobFacts, now: float) -> None:
        """A published, live verdict (cheap unless a rule acts on it now)."""
        for decision in self.policy.observe(facts, now):
            if decision.outcome != ACT:
                entry = not_carried_out(decision, self._evidence_url(facts.job_id))
                self._record(decision, entry.outcome, entry.detail, target=entry.target)
                continue
            refused = self._refused_command(decision)
            if refused is not None:
                self._record(decision, refused.outcome, refused.detail)
            else:
                self._queue.append(decision)

    def _refused_command(self, decision: Decision) -> NotRun | None:
        """A command whose placeholders are not data of their kinds: refused before it is queued."""
        if decision.rule.kind != "command":
            return None
        argv = command_line(decision.rule, payload(decision, self._evidence_url(decision.facts.job_id), dry_run=False))
        return argv if isinstance(argv, NotRun) and argv.outcome == "refused" else None

    def keep_only(self, job_ids: set[str]) -> None:
        self.policy.keep_only(job_ids)

    async def run_pending(self, client: httpx.AsyncClient) -> None:
        """Carry out what was decided; record signal actions whose agents answered."""
        while self._queue:
            decision = self._queue.popleft()
            rule = decision.rule
            body = payload(decision, self._evidence_url(decision.facts.job_id), dry_run=False)
            if rule.kind == "command":
                argv = command_line(rule, body)
                if isinstance(argv, NotRun):
                    self._record(decision, argv.outcome, argv.detail)
                    continue
                ok, detail = await run_command(argv, body, rule.timeout_s)
                self._record(decision, "ok" if ok else "failed", detail, target=" ".join(argv))
            elif rule.kind == "webhook":
                assert rule.webhook is not None
                ok, detail = await post_webhook(client, rule.webhook, body, rule.timeout_s)
                self._record(decision, "ok" if ok else "failed", detail)
            else:
                self._order_signals(decision)
        for done in self.orders.finished(self.clock()):
            decision, target = self._signals.pop(done.key)
            self._record(decision, "ok" if done.ok else "failed", done.detail, target=target)

    def _order_signals(self, decision: Decision) -> None:
        assert decision.rule.signal is not None
        # A culprit that does not say its node's spelling of the job is named by the job's own id.
        targets = [(c.node, c.job_id or decision.facts.job_id, c.rank, c.pid, c.started_at)
                   for c in decision.facts.culprits if c.pid]
        key = next(self._signal_ids)
        self._signals[key] = (decision, f"{decision.rule.signal} to " + ", ".join(
            f"rank {rank} (pid {pid} on {node})" for node, _, rank, pid, _ in targets))
        self.orders.order(key, decision.rule.signal, targets, self.clock())

    def _evidence_url(self, job_id: str) -> str | None:
        template = self.config.evidence_url or (self.page_url and f"{self.page_url.rstrip('/')}/?job={{job}}")
        return template.replace("{job}", job_id) if template else None

    def _record(self, decision: Decision, outcome: str, detail: str, target: str | None = None) -> None:
        facts = decision.facts
        record = ActionRecord(
            at=self.clock(), job_id=facts.job_id, incident_started_at=decision.incident_started_at,
            rule=decision.rule.name, kind=decision.rule.kind, verdict=facts.verdict,
            culprit_ranks=tuple(sorted({c.rank for c in facts.culprits})),
            culprit_nodes=tuple(sorted({c.node for c in facts.culprits})),
            target=target or decision.rule.target, outcome=outcome, detail=detail)
        with self._lock:
            key = (record.rule, record.kind, outcome)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.recent.append(record)
        (log.info if outcome in ("dry_run", "ok") else log.warning)(
            "action %s on job %s (%s, ranks %s): %s: %s", record.rule, record.job_id, record.verdict,
            list(record.culprit_ranks), outcome, detail)
        self.store.add_action(record)

    def audit(self, job_id: str | None = None, limit: int = 200) -> list[ActionRecord]:
        return self.store.actions(job_id, limit)

    @staticmethod
    def as_json(record: ActionRecord) -> dict[str, Any]:
        return {"at": record.at, "job_id": record.job_id, "incident_started_at": record.incident_started_at,
                "rule": record.rule, "kind": record.kind, "verdict": record.verdict,
                "culprit_ranks": list(record.culprit_ranks), "culprit_nodes": list(record.culprit_nodes),
                "target": record.target, "outcome": record.outcome, "detail": record.detail,
                # Whether it ran at all: a dry run, a refusal or a held-back decision only says what it would do.
                "ran": record.outcome in RAN}
