"""The outage journal: what it keeps, its bounds, its file; and a sender delivering it to a real monitor."""

from __future__ import annotations

import contextlib
import copy
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agent.outage_journal import OutageJournal, signature
from agent.sender import Sender
from tests.agent.conftest import Receiver
from tests.monitor.real_monitor import free_port, metric, running_monitor, running_relay

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)


def _rank(r: int = 0, **fields) -> dict:
    return {"job_id": "job-j", "rank": r, "world_size": 2, "pid": 100 + r, "alive": True, "state": "S",
            "cpu_percent": 50.0, "log_errors": [], **fields}


def _report(*ranks: dict, **fields) -> dict:
    return {"schema_version": 1, "node": "node-j", "sent_at": 0.0, "ranks": list(ranks or (_rank(0), _rank(1))),
            **fields}


BASE = _report()


def _changed(**rank1) -> dict:
    return _report(_rank(0), _rank(1, **rank1))


@pytest.mark.parametrize(("name", "other", "event"), [
    ("the same report", BASE, False),
    ("only numbers moved", _report(_rank(0, cpu_percent=99.0), _rank(1, progress={"step": 7})), False),
    ("a rank exited", _changed(alive=False, exit={"code": None, "signal": 9}), True),
    ("a rank was stopped", _changed(state="T"), True),
    ("a new log error", _changed(log_errors=["RuntimeError: boom"]), True),
    ("a first stack", _changed(stack={"threads": [{"frames": [{"name": "all_reduce"}]}]}), True),
    ("a rank restarted under a new pid", _changed(pid=999), True),
    ("a launcher appeared", _report(_rank(0), _rank(1), launchers=[{"pid": 5}]), True),
])
def test_what_counts_as_an_event(name: str, other: dict, event: bool) -> None:
    assert (signature(other) != signature(BASE)) is event


def test_events_are_kept_at_once_and_quiet_stretches_every_few_seconds() -> None:
    journal = OutageJournal(keep_every_s=5.0)
    kept = [journal.keep(BASE, t) for t in (0, 0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)]
    # The first is an event, the one a second later its follow-up, then one every 5 s.
    assert kept == [True, False, True, False, False, False, False, True, False, False, False, False, True]
    assert journal.keep(_changed(state="T"), 11.5)
    assert not journal.keep(_changed(state="T"), 12.0) and journal.keep(_changed(state="T"), 12.5)
    assert [k.taken_at for k in journal._entries] == [0, 1, 6, 11, 11.5, 12.5]


def test_past_its_bound_the_oldest_quiet_entry_goes_first() -> None:
    journal = OutageJournal(max_entries=4, keep_every_s=2.0)
    journal.keep(BASE, 0)  # the first one is an event (nothing before it)
    journal.keep(BASE, 1)  # its follow-up
    journal.keep(_changed(state="T"), 2)
    journal.keep(_changed(state="T"), 3)
    journal.keep(_changed(state="T"), 5)
    assert [(k.taken_at, k.event) for k in journal._entries] == [(0, True), (2, True), (3, False), (5, False)]
    assert journal.dropped == 1
    journal.keep(_changed(alive=False), 6)
    assert [k.taken_at for k in journal._entries] == [0, 2, 5, 6]


def test_a_journal_on_disk_survives_an_agent_restart(tmp_path: Path) -> None:
    path = tmp_path / "outage.jsonl"
    journal = OutageJournal(path)
    journal.keep(BASE, 10.0)
    journal.keep(_changed(alive=False), 11.0)
    with path.open("a") as f:
        f.write('{"taken_at": 12.0, "ev')  # cut short by a crash
    again = OutageJournal(path)
    assert [(k.taken_at, k.report["ranks"][1]["alive"]) for k in again._entries] == [(10.0, True), (11.0, False)]
    again.delivered_oldest()
    again.delivered_oldest()
    assert len(again) == 0 and path.read_text() == ""


def _exited() -> dict:
    return _changed(alive=False, exit={"at": time.time(), "code": 1, "source": "proc"})


def _wait(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_reports_taken_while_the_first_failing_post_hung_are_kept() -> None:
    """The outage starts with a post that hangs (a monitor that accepts and never answers in time):
    what the agent took meanwhile, a rank stopped and then its exit, is the outage's first news."""
    receiver = Receiver(status=500)
    receiver.hold = lambda report: True
    sender = Sender(receiver.url)
    sender.start()
    try:
        sender.offer(copy.deepcopy(BASE))
        receiver.wait_for(lambda r: True, timeout=5)  # that post waits for its answer
        sender.offer(_changed(state="T"))
        sender.offer(_exited())
        receiver.released.set()
        _wait(lambda: sender.failed >= 1, "the first post never failed")
        with sender._cond:  # the sending thread adds to the journal
            kept = [(k.report["ranks"][1]["state"], k.report["ranks"][1]["alive"]) for k in sender.journal.entries()]
        assert kept == [("S", True), ("T", True), ("S", False)], kept
    finally:
        receiver.released.set()
        sender.stop()
        receiver.close()


def _back_from_an_outage(hold: Callable[[dict], bool]) -> tuple[Receiver, Sender]:
    """A sender with one report kept from an outage, and a monitor back that holds the posts ``hold`` picks."""
    journal = OutageJournal()
    journal.keep(copy.deepcopy(BASE), time.time() - 5)
    receiver = Receiver(status=202)
    receiver.answer = {"accepted": True, "replay": True}
    receiver.hold = hold
    return receiver, Sender(receiver.url, journal=journal)


def test_what_was_kept_while_the_first_live_post_was_on_its_way_is_not_left_for_the_next_outage() -> None:
    receiver, sender = _back_from_an_outage(hold=lambda report: not report.get("replayed"))
    sender.start()
    try:
        sender.offer(copy.deepcopy(BASE))
        receiver.wait_for(lambda r: not r.get("replayed"), timeout=10)  # the first live post waits
        sender.offer(_exited())
        receiver.released.set()
        receiver.wait_for(lambda r: not r.get("replayed") and not r["ranks"][1]["alive"], timeout=10)
        # The exit reached the monitor live; nothing waits to be replayed at the next outage as news.
        assert len(sender.journal) == 0, [k.report for k in sender.journal.entries()]
        replayed = [bool(r.get("replayed")) for r in receiver.reports]
        assert replayed[0] and not any(replayed[replayed.index(False):]), replayed
    finally:
        receiver.released.set()
        sender.stop()
        receiver.close()


def test_after_the_journal_the_newest_report_is_the_present_not_an_older_one() -> None:
    """A report taken while the journal was delivered goes with it, and is the first live one after:
    the report taken before delivery began would show the monitor a step back (the rank alive again)."""
    receiver, sender = _back_from_an_outage(hold=lambda report: bool(report.get("replayed")))
    sender.start()
    try:
        sender.offer(copy.deepcopy(BASE))
        receiver.wait_for(lambda r: bool(r.get("replayed")), timeout=10)  # the journal's delivery waits
        sender.offer(_exited())
        receiver.released.set()
        receiver.wait_for(lambda r: not r.get("replayed"), timeout=10)
        live = [r for r in receiver.reports if not r.get("replayed")]
        assert live[0]["ranks"][1]["alive"] is False, live
    finally:
        receiver.released.set()
        sender.stop()
        receiver.close()


def _history(base: str, job_id: str) -> list[dict]:
    answer = httpx.get(f"{base}/api/v1/jobs/{job_id}/history", timeout=5)
    return answer.json()["history"] if answer.status_code == 200 else []


@pytest.mark.parametrize("via_relay", [False, True], ids=["direct", "through-a-relay"])
def test_a_sender_delivers_what_it_kept_when_the_monitor_comes_back(tmp_path: Path, via_relay: bool) -> None:
    """Through a relay too: the relay says the monitor behind it is down (not busy), so the agent
    keeps its outage journal, and the relay carries the replayed reports to the monitor when back."""
    port = free_port()
    db = tmp_path / "monitor.db"
    with contextlib.ExitStack() as stack:
        url = f"http://127.0.0.1:{port}"
        if via_relay:
            url = stack.enter_context(running_relay(tmp_path, url)).base
        _deliver_after_an_outage(tmp_path, port, db, Sender(url))


def _deliver_after_an_outage(tmp_path: Path, port: int, db: Path, sender: Sender) -> None:
    sender.start()
    try:
        def live(report: dict) -> dict:
            body = copy.deepcopy(report)
            sender.offer(body)
            return body

        with running_monitor(tmp_path, port=port, db=db) as monitor:
            live(BASE)
            deadline = time.monotonic() + 15
            while sender.sent < 1:
                assert time.monotonic() < deadline, "the first report never arrived"
                time.sleep(0.1)
        # The monitor is gone. Rank 1 exits 2 s into the outage; the agent goes on sampling.
        outage_started = time.time()
        for i in range(8):
            live(BASE if i < 2 else _changed(alive=False, exit={"at": time.time(), "code": 1, "source": "proc"}))
            if i == 2:
                exited_at = time.time()
            time.sleep(1)
        assert len(sender.journal) >= 2
        with running_monitor(tmp_path, port=port, db=db) as monitor:
            back = time.monotonic()
            deadline = back + 20
            while not any(h["verdict"] == "rank_exited" for h in _history(monitor.base, "job-j")):
                live(_changed(alive=False, exit={"at": exited_at, "code": 1, "source": "proc"}))
                assert time.monotonic() < deadline, _history(monitor.base, "job-j")
                time.sleep(0.5)
            delivered_in = time.monotonic() - back
            # At its own time, from the replays (the live report after them records the present again).
            exit_change = [h for h in _history(monitor.base, "job-j") if h["verdict"] == "rank_exited"][0]
            # Within seconds of the exit (a loaded machine's sender journals a report late: 1.6 s was seen in
            # a clean-clone run), long before the delivery, which comes 5 s or more after it.
            assert outage_started < exit_change["at"] <= exited_at + 3.0
            assert exit_change["culprit_ranks"] == [1]
            # The history can show the exit before the sender is through: a report offered meanwhile
            # joins the journal until the delivery ends (through a relay, 50 ms or more a report).
            _wait(lambda: len(sender.journal) == 0, f"the journal never emptied: {len(sender.journal)} left")
            assert sender.replayed >= 2
            assert delivered_in < 10
    finally:
        sender.stop()


def test_an_agent_restarted_during_an_outage_still_delivers_what_it_kept(tmp_path: Path) -> None:
    port = free_port()
    journal_dir = tmp_path / "journal"
    argv = [sys.executable, "-m", "agent.cli", "--monitor", f"http://127.0.0.1:{port}", "--interval", "0.2",
            "--no-stacks", "--no-nccl-ras", "--job", "no-such-job", "--node", "node-kept",
            "--outage-journal", str(journal_dir)]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not any(f.stat().st_size for f in journal_dir.glob("*.jsonl")) if journal_dir.exists() else True:
            assert time.monotonic() < deadline and first.poll() is None, "nothing kept on disk"
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=10)
    with running_monitor(tmp_path, port=port) as monitor:
        second = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while metric(monitor.base, "hangwatch_monitor_reports_replayed_total") < 1:
                assert time.monotonic() < deadline, "what the first agent kept never arrived"
                time.sleep(0.2)
            deadline = time.monotonic() + 10
            while any(f.stat().st_size for f in journal_dir.glob("*.jsonl")):
                assert time.monotonic() < deadline, "the journal file was not emptied after delivery"
                time.sleep(0.2)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=10)
