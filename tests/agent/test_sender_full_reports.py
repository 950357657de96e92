"""When the sender sends a full report: after an outage, to a monitor that paces them, to one that does not.
Against a real HTTP receiver on loopback (tests/agent/conftest.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from agent.outage_journal import OutageJournal
from agent.sender import Sender
from tests.agent.conftest import Receiver
from tests.monitor.monitor_reports import rank, report, stack

TAKES_DELTAS = {"accepted": True, "delta": True, "send_full": False, "replay": True}


def node_report(cpu: float = 50.0) -> dict:
    """A fresh full report each time, as the runner builds it (1 s interval)."""
    return report(ranks=[rank(cpu_percent=cpu, stack=stack(100.0))], sent_at=0.0)


def offered_and_received(sender: Sender, receiver: Receiver, **marks: float) -> tuple[float, dict]:
    """Offer a report marked by its CPU figure; when it was offered, and the body that arrived."""
    cpu = marks["cpu"]
    offered = time.time()
    sender.offer(node_report(cpu))
    body = receiver.wait_for(lambda r: r["ranks"][0]["cpu_percent"] == cpu, timeout=10)
    live = sum(not r.get("replayed") for r in receiver.reports)
    deadline = time.monotonic() + 10
    while sender.sent < live:  # its answer read: the test may change the next one
        assert time.monotonic() < deadline, "the sender never took the answer"
        time.sleep(0.01)
    return offered, body


@contextlib.contextmanager
def sending(answer: dict, journal: OutageJournal | None = None,
            rng: Callable[[], float] | None = None) -> Iterator[tuple[Sender, Receiver]]:
    """A started sender posting to a receiver that answers ``answer``; both closed after."""
    receiver = Receiver(status=202)
    receiver.answer = answer
    sender = Sender(receiver.url, journal=journal)
    if rng is not None:
        sender.delta.rng = rng
    sender.start()
    try:
        yield sender, receiver
    finally:
        sender.stop()
        receiver.close()


def test_after_an_outage_the_deltas_go_on_from_the_last_kept_report():
    """The monitor took the kept report whole: its picture of the node is that one, and the first live
    report is a delta on it (a restarted monitor would ask for the full report and say when)."""
    journal = OutageJournal()
    journal.keep(node_report(), time.time() - 3)
    with sending(TAKES_DELTAS, journal) as (sender, receiver):
        _, live = offered_and_received(sender, receiver, cpu=61.0)
        assert receiver.reports[0]["replayed"] is True
        assert live.get("delta") is True and live["host"] is None, live
        assert live["ranks"][0]["stack"] is None  # the kept report carried it


def test_a_monitor_that_takes_no_kept_reports_gets_a_full_report_spread_after_an_outage():
    journal = OutageJournal()
    journal.keep(node_report(), time.time() - 3)
    # no "replay": it took the kept report as news
    with sending({"accepted": True, "delta": True}, journal, rng=lambda: 0.8) as (sender, receiver):
        offered, live = offered_and_received(sender, receiver, cpu=62.0)
        assert "delta" not in live and live["host"] is not None
        assert live["sent_at"] - offered >= 0.7  # held 0.8 of its 1 s interval


def test_a_monitor_that_asks_without_saying_when_gets_the_full_report_held_a_part_of_an_interval():
    with sending(TAKES_DELTAS, rng=lambda: 0.6) as (sender, receiver):
        offered_and_received(sender, receiver, cpu=63.0)  # the first report: full, at once
        offered, delta = offered_and_received(sender, receiver, cpu=64.0)
        assert delta.get("delta") is True and delta["sent_at"] - offered < 0.5
        receiver.answer = dict(TAKES_DELTAS, send_full=True)  # an older monitor, after its restart
        offered_and_received(sender, receiver, cpu=65.0)
        receiver.answer = TAKES_DELTAS
        offered, full = offered_and_received(sender, receiver, cpu=66.0)
        assert "delta" not in full
        assert full["sent_at"] - offered >= 0.5  # held 0.6 s: a fleet does not send them in one instant


def test_a_monitor_that_says_when_gets_deltas_until_then_and_nothing_is_held():
    with sending(TAKES_DELTAS) as (sender, receiver):
        offered_and_received(sender, receiver, cpu=67.0)
        receiver.answer = dict(TAKES_DELTAS, send_full=True, full_in_s=1.5)
        offered_and_received(sender, receiver, cpu=68.0)  # a delta, answered with a slot 1.5 s away
        offered, delta = offered_and_received(sender, receiver, cpu=69.0)
        assert delta.get("delta") is True and delta["sent_at"] - offered < 0.5
        time.sleep(1.5)
        offered, full = offered_and_received(sender, receiver, cpu=70.0)
        assert "delta" not in full and full["sent_at"] - offered < 0.5
