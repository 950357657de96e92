"""A node's reports in the order its agent sent them (monitor/report_order.py): a report body
captured and posted again, with the node's own token, is refused; a restarted agent is heard."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import running_monitor

from monitor.report_order import CURRENT_RUN_SILENT_S, LastTaken, stale_reason

NOW = 1_800_000_000.0
RUN = (NOW - 600, 42)  # the agent's started_at and pid


def sent(seq: int | None, run: tuple[float | None, int | None] = RUN) -> SimpleNamespace:
    return SimpleNamespace(seq=seq, agent=SimpleNamespace(started_at=run[0], pid=run[1]))


LAST = LastTaken(RUN[0], RUN[1], 10, NOW - 1)


@pytest.mark.parametrize(("what", "report_", "last", "now", "stale"), [
    ("the next report", sent(11), LAST, NOW, False),
    ("a gap (reports lost on the way) is fine", sent(50), LAST, NOW, False),
    ("the same report again", sent(10), LAST, NOW, True),
    ("an older report of the run", sent(3), LAST, NOW, True),
    ("a restarted agent, numbered from 1", sent(1, (NOW - 5, 77)), LAST, NOW, False),
    ("a report of an earlier run while the current one reports", sent(500, (NOW - 6000, 41)), LAST, NOW, True),
    ("... taken once the current run has been silent (a reboot with the clock behind)",
     sent(1, (NOW - 6000, 41)), LAST, NOW + CURRENT_RUN_SILENT_S + 1, False),
    ("a report without a number (an agent from before)", sent(None), LAST, NOW, False),
    ("the node's first report", sent(7), None, NOW, False),
    ("a node whose last report had no number", sent(1), LastTaken(RUN[0], RUN[1], None, NOW), NOW, False),
])
def test_which_reports_are_stale(what: str, report_, last, now: float, stale: bool) -> None:
    assert (stale_reason(report_, last, now) is not None) == stale, what


NODE_TOKEN = "node-a-token-0123456789abcdef"


def test_replayed_bodies_are_refused_and_a_restarted_agent_is_heard(tmp_path: Path) -> None:
    tokens = tmp_path / "agents.tokens"
    tokens.write_text(f"node-a {NODE_TOKEN}\n")
    tokens.chmod(0o600)
    agent = {"version": "0.1.0", "pid": 42, "started_at": time.time() - 60, "interval_s": 1.0, "py_spy": "ok"}
    with running_monitor(tmp_path, "--token-file", str(tokens)) as monitor:
        url, auth = monitor.base + "/api/v1/reports", {"authorization": f"Bearer {NODE_TOKEN}"}

        def post(body: dict) -> int:
            return httpx.post(url, json=body, headers=auth, timeout=5).status_code

        first = report(node="node-a", ranks=[rank(job_id="job-r")], agent=agent, seq=1, sent_at=time.time())
        second = {**first, "seq": 2, "sent_at": time.time()}
        assert post(first) == 202 and post(second) == 202
        # Captured bodies posted again, verbatim or alternating: refused, counted, the picture kept.
        assert [post(first), post(second), post(first)] == [409, 409, 409]
        answer = httpx.post(url, json=first, headers=auth, timeout=5)
        assert "not newer than report 2" in answer.json()["detail"]
        assert post({**first, "seq": 3, "sent_at": time.time()}) == 202
        # The agent restarts: a new run, numbered from 1.
        restarted = {**agent, "pid": 43, "started_at": time.time()}
        assert post({**first, "agent": restarted, "seq": 1, "sent_at": time.time()}) == 202
        assert post(second) == 409  # the old run's body, while the new run reports
        metrics = httpx.get(monitor.base + "/metrics", timeout=5).text
        assert 'hangwatch_reports_rejected_total{reason="stale"} 5' in metrics
