"""A node's reports in the order its agent sent them (monitor/ingest/report_order.py): a report body
captured and posted again, with the node's own token, is refused; a restarted agent is heard."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from monitor_reports import rank, report
from real_monitor import running_monitor

from agent.sender import Sender
from monitor.ingest.report_order import CURRENT_RUN_SILENT_S, MAX_SEQ_AHEAD, LastTaken, runs_replaced, stale_reason

NOW = 1_800_000_000.0
RUN = (NOW - 600, 42)  # the agent's started_at and pid


def sent(seq: int | None, run: tuple[float | None, int | None] = RUN) -> SimpleNamespace:
    return SimpleNamespace(seq=seq, agent=SimpleNamespace(started_at=run[0], pid=run[1]))


LAST = LastTaken(RUN[0], RUN[1], 10, NOW - 1)
UNNUMBERED = LastTaken(RUN[0], RUN[1], None, NOW)
BEHIND = LastTaken(RUN[0] - 3600, RUN[1], 10, NOW - 1, offset=3600.0)
AHEAD = LastTaken(RUN[0] + 3600, RUN[1], 10, NOW - 1, offset=-3600.0)
REPLACED = LastTaken(RUN[0], RUN[1], 10, NOW - 1, past_runs=((NOW - 6000, 41),))


@pytest.mark.parametrize(("what", "report_", "last", "now", "stale"), [
    ("the next report", sent(11), LAST, NOW, False),
    ("a gap (reports lost on the way) is fine", sent(50), LAST, NOW, False),
    ("the same report again", sent(10), LAST, NOW, True),
    ("an older report of the run", sent(3), LAST, NOW, True),
    ("a restarted agent, numbered from 1", sent(1, (NOW - 5, 77)), LAST, NOW, False),
    ("a report of an earlier run while the current one reports", sent(500, (NOW - 6000, 41)), LAST, NOW, True),
    ("... taken once the current run has been silent (a reboot with the clock behind)",
     sent(1, (NOW - 6000, 41)), LAST, NOW + CURRENT_RUN_SILENT_S + 1, False),
    ("a report without a number while the node's agent numbers (its seq taken out)", sent(None), LAST, NOW, True),
    ("... from another run too", sent(None, (NOW - 5, 77)), LAST, NOW, True),
    ("a report without a number from an agent from before", sent(None), UNNUMBERED, NOW, False),
    ("the node's first report", sent(7), None, NOW, False),
    ("a node whose last report had no number", sent(1), UNNUMBERED, NOW, False),
    ("a number far ahead of the last (a forged one)", sent(10**15), LAST, NOW, True),
    ("... just past what the agent can have sent", sent(10 + MAX_SEQ_AHEAD + 21), LAST, NOW, True),
    ("... within it", sent(10 + MAX_SEQ_AHEAD + 19), LAST, NOW, False),
    ("a long outage's worth of numbers", sent(10 + 3600 * 5), LAST, NOW + 3600, False),
    ("a run the node replaced, even once the current one is silent", sent(900, (NOW - 6000, 41)), REPLACED,
     NOW + CURRENT_RUN_SILENT_S + 1, True),
    ("a new run dated ahead of now (a forged one, to make the agent's own runs older)",
     sent(1, (NOW + 3600, 43)), LAST, NOW, True),
    ("... by the node's clock: a node an hour behind starts a run", sent(1, (NOW - 3600, 43)), BEHIND, NOW, False),
    ("... a node an hour ahead starts one", sent(1, (NOW + 3600, 43)), AHEAD, NOW, False),
    ("... taken once the current run has been silent (the node's clock jumped)", sent(1, (NOW + 3600, 43)), LAST,
     NOW + CURRENT_RUN_SILENT_S + 1, False),
])
def test_which_reports_are_stale(what: str, report_, last, now: float, stale: bool) -> None:
    assert (stale_reason(report_, last, now) is not None) == stale, what


NODE_TOKEN = "node-a-token-0123456789abcdef"
NODE_C_TOKEN = "node-c-token-0123456789abcdef"


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


def test_a_replaced_run_is_remembered_and_the_memory_is_bounded() -> None:
    last = LastTaken(RUN[0], RUN[1], 10, NOW)
    assert runs_replaced(last, sent(11)) == ()
    assert runs_replaced(last, sent(1, (NOW, 43))) == (RUN,)
    for pid in range(100):
        last = LastTaken(NOW + pid, pid, 1, NOW, runs_replaced(last, sent(1, (NOW + pid, pid))))
    assert len(last.past_runs) == 16 and last.past_runs[-1] == (NOW + 98, 98)


@pytest.mark.live  # waits out CURRENT_RUN_SILENT_S: handed out before the quick tier
def test_forged_numbers_neither_pass_nor_lock_the_agent_out(tmp_path: Path) -> None:
    """The issue's probes against a real monitor, with the agent's own sender: a captured body with
    its number taken out, one numbered 10^15, one a little ahead (taken: the agent's next numbers
    are then stale, and it starts a new run by itself), and an earlier run's body once the node's
    current run has been silent."""
    tokens = tmp_path / "agents.tokens"
    tokens.write_text(f"node-a {NODE_TOKEN}\nnode-c {NODE_C_TOKEN}\n")
    tokens.chmod(0o600)
    agent = {"version": "0.1.0", "pid": 42, "started_at": time.time() - 60, "interval_s": 1.0, "py_spy": "ok"}
    with running_monitor(tmp_path, "--token-file", str(tokens)) as monitor:
        url = monitor.base + "/api/v1/reports"

        def post(body: dict, token: str = NODE_TOKEN) -> httpx.Response:
            return httpx.post(url, json=body, headers={"authorization": f"Bearer {token}"}, timeout=5)

        # node-c's agent runs, is replaced by a new run, which then falls silent (the silence is waited
        # for at the end, while the other probes run).
        old_run = report(node="node-c", ranks=[rank(job_id="job-c")], agent=agent, seq=7, sent_at=time.time())
        assert post(old_run, NODE_C_TOKEN).status_code == 202
        new_run = {**agent, "pid": 43, "started_at": time.time()}
        assert post({**old_run, "agent": new_run, "seq": 1, "sent_at": time.time()}, NODE_C_TOKEN).status_code == 202
        silent_since = time.monotonic()

        sender = Sender(monitor.base, token=lambda: NODE_TOKEN)
        try:
            body = report(node="node-a", ranks=[rank(job_id="job-r")], agent=agent)
            sender.post(body)
            sender.post(body)
            assert (sender.sent, sender.runs_started) == (2, 0)  # taken, both
            captured = {**body, "seq": 2, "sent_at": time.time()}
            unnumbered = {k: v for k, v in captured.items() if k != "seq"}
            assert post(unnumbered).status_code == 409
            answer = post({**captured, "seq": 10**15})
            assert answer.status_code == 409 and "a forged number" in answer.json()["detail"], answer.text
            assert post({**captured, "seq": 100}).status_code == 202  # within reach: taken
            # The agent's own next number (3) is stale now: refused, and its reports start a new run.
            sender.post(body)
            assert (sender.sent, sender.runs_started) == (2, 1)
            sender.post(body)
            assert (sender.sent, sender.runs_started) == (3, 1)  # the new run's first report: taken
            assert post({**captured, "seq": 101}).status_code == 409  # the replaced run is over
        finally:
            sender.client.close()

        while time.monotonic() - silent_since <= CURRENT_RUN_SILENT_S + 1:
            time.sleep(0.5)
        answer = post({**old_run, "seq": 8, "sent_at": time.time()}, NODE_C_TOKEN)
        assert answer.status_code == 409 and "since replaced" in answer.json()["detail"], answer.text
        metrics = httpx.get(monitor.base + "/metrics", timeout=5).text
        assert 'hangwatch_reports_rejected_total{reason="stale"} 5' in metrics
