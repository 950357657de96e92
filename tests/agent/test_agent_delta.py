"""Delta reports (agent/delta.py): what a compacted report keeps and drops, always against the
last baseline the monitor acknowledged. Pure: no network, no processes."""

from __future__ import annotations

import copy

import pytest

from agent.delta import DeltaState
from monitor.ingest.wire import Report
from tests.monitor.monitor_reports import progress, rank, report, socket, stack

DELTA = {"delta": True}
TAKEN_AT = 100.0
RECENT = [(98.0, 1), (99.0, 2), (100.0, 3)]
SOCKETS = [socket("10.0.0.2:40000", "10.0.0.1:29500")]
ENV = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
NCCL_RAS = {
    "polled_at": 199.0, "unchanged_since": 150.0, "status": "ok", "address": "localhost:28028",
    "nccl_version": "2.28.9",
    "communicators": [{"hash": "0x1", "size": 2, "ranks_count": 2, "missing_ranks": [], "ranks": [
        {"rank": 0, "pid": 1000, "host": "10.0.0.2", "collective_counts": {"AllReduce": 64}, "async_error": None,
         "aborted": False, "destroyed": False, "finalized": False}]}],
}


def rank_of(**changes) -> dict:
    """Rank 0 of job-a with every field a delta can drop; ``changes`` override them."""
    fields = {
        "stack": stack(TAKEN_AT),
        "progress": progress(3, 3, recent=RECENT),
        "sockets": SOCKETS,
        "env": ENV,
    }
    fields.update(changes)
    return rank(**fields)


def node_report(*ranks: dict, **fields) -> dict:
    """A node's full report, as the agent builds it every interval (a fresh dict each time)."""
    fields.setdefault("nccl_ras", copy.deepcopy(NCCL_RAS))
    return report(ranks=list(ranks) if ranks else [rank_of()], sent_at=200.0, **fields)


def acknowledged(full: dict, answer: dict | None = DELTA) -> DeltaState:
    """A state whose monitor took ``full`` (a full report) and answered ``answer``."""
    state = DeltaState()
    sent, baseline = state.compact(full)
    assert sent == full and "delta" not in sent
    state.delivered(baseline, answer)
    return state


def only_rank(compacted: dict) -> dict:
    assert len(compacted["ranks"]) == 1
    return compacted["ranks"][0]


# --- before the monitor says it takes deltas -------------------------------------------------


def test_the_first_report_is_full():
    full = node_report()
    sent, _ = DeltaState().compact(full)
    assert sent == full and "delta" not in sent


@pytest.mark.parametrize("answer", [None, {}, {"delta": False}, {"ok": True}])
def test_reports_stay_full_until_the_monitor_says_delta(answer):
    state = acknowledged(node_report(), answer)
    again = node_report()
    sent, _ = state.compact(again)
    assert sent == again and "delta" not in sent
    assert state.monitor_takes_deltas is False


def test_a_monitor_that_stops_saying_delta_gets_full_reports_again():
    state = acknowledged(node_report())
    sent, baseline = state.compact(node_report())
    assert sent["delta"] is True
    state.delivered(baseline, {})
    sent, _ = state.compact(node_report())
    assert "delta" not in sent and sent["host"] is not None


# --- what an unchanged report drops, what a change keeps --------------------------------------

# (what, where it is in the compacted report, the value that means "unchanged")
UNCHANGED = [
    ("host", lambda r: r["host"], None),
    ("nccl_ras", lambda r: r["nccl_ras"], None),
    ("stack", lambda r: only_rank(r)["stack"], None),
    ("sockets", lambda r: only_rank(r)["sockets"], None),
    ("env", lambda r: only_rank(r)["env"], {}),
    ("cmdline", lambda r: only_rank(r)["cmdline"], ""),
    ("progress points", lambda r: only_rank(r)["progress"]["recent"], []),
]


@pytest.mark.parametrize("what, get, dropped", UNCHANGED, ids=[u[0] for u in UNCHANGED])
def test_unchanged_facts_are_dropped(what, get, dropped):
    state = acknowledged(node_report())
    sent, _ = state.compact(node_report())
    assert sent["delta"] is True
    assert get(sent) == dropped


def test_what_a_delta_always_keeps():
    full = node_report()
    sent, _ = acknowledged(full).compact(node_report())
    for key in ("schema_version", "node", "sent_at", "agent", "collectors"):
        assert sent[key] == full[key], key
    kept = only_rank(sent)
    for key in ("job_id", "rank", "world_size", "pid", "state", "cpu_percent", "rss_bytes", "alive"):
        assert kept[key] == full["ranks"][0][key], key
    # The progress counters stay: only the points the monitor has leave "recent".
    assert kept["progress"]["events"] == 3 and kept["progress"]["step"] == 3


def test_the_cpu_a_rank_was_denied_is_sent_every_time_even_unchanged():
    """A rate over the last interval, like cpu_percent: its null means "not read", never "unchanged"."""
    sched = {"run_queue_wait_percent": 62.5, "cpu_throttled_percent": 0.0, "cgroup": "/job"}
    sent, _ = acknowledged(node_report(rank_of(sched=sched))).compact(node_report(rank_of(sched=dict(sched))))
    assert sent["delta"] is True and only_rank(sent)["sched"] == sched
    Report.model_validate(sent)


NEW_HOST = {"hostname": "node-a", "cpu_count": 16, "cpu_flags": [], "cpu_model": "Other CPU"}
NEW_SOCKETS = [socket("10.0.0.2:40001", "10.0.0.1:29500", state="SYN_SENT")]
NEW_ENV = dict(ENV, MASTER_PORT="29501")
NEW_NCCL_RAS = dict(NCCL_RAS, polled_at=202.0)  # the next poll, the same answer

# (what changed, the next full report, where it is in the compacted report, what must be sent)
CHANGED = [
    ("host", node_report(host=NEW_HOST), lambda r: r["host"], NEW_HOST),
    ("nccl_ras", node_report(nccl_ras=NEW_NCCL_RAS), lambda r: r["nccl_ras"], NEW_NCCL_RAS),
    ("new dump", node_report(rank_of(stack=stack(TAKEN_AT + 5))), lambda r: only_rank(r)["stack"],
     stack(TAKEN_AT + 5)),
    ("sockets", node_report(rank_of(sockets=NEW_SOCKETS)), lambda r: only_rank(r)["sockets"], NEW_SOCKETS),
    ("sockets gone", node_report(rank_of(sockets=[])), lambda r: only_rank(r)["sockets"], []),
    ("env", node_report(rank_of(env=NEW_ENV)), lambda r: only_rank(r)["env"], NEW_ENV),
    ("cmdline", node_report(rank_of(cmdline="python train.py --resume")), lambda r: only_rank(r)["cmdline"],
     "python train.py --resume"),
]


@pytest.mark.parametrize("what, changed, get, expected", CHANGED, ids=[c[0] for c in CHANGED])
def test_changed_facts_are_sent(what, changed, get, expected):
    state = acknowledged(node_report())
    sent, _ = state.compact(copy.deepcopy(changed))
    assert sent["delta"] is True
    assert get(sent) == expected


def test_only_new_progress_points_are_sent():
    state = acknowledged(node_report())
    later = node_report(rank_of(progress=progress(5, 5, recent=RECENT[1:] + [(101.0, 4), (102.0, 5)])))
    kept = only_rank(state.compact(later)[0])["progress"]
    assert kept["recent"] == [[101.0, 4], [102.0, 5]]
    assert kept["events"] == 5 and kept["step"] == 5 and kept["step_at"] == 102.0


def test_progress_is_whole_when_the_monitor_had_no_points():
    state = acknowledged(node_report(rank_of(progress=progress(0, None))))
    later = node_report(rank_of(progress=progress(1, 1, recent=[(101.0, 1)])))
    assert only_rank(state.compact(later)[0])["progress"]["recent"] == [[101.0, 1]]


def test_a_new_pid_for_a_rank_is_sent_whole():
    state = acknowledged(node_report())
    restarted = rank_of(pid=2000)
    sent, _ = state.compact(node_report(copy.deepcopy(restarted)))
    assert only_rank(sent) == restarted


def test_a_new_rank_is_sent_whole_next_to_a_compacted_one():
    state = acknowledged(node_report())
    newcomer = rank_of(job_id="job-b", rank=1, pid=1101)
    sent, _ = state.compact(node_report(rank_of(), copy.deepcopy(newcomer)))
    old, new = sent["ranks"]
    assert old["stack"] is None and old["env"] == {}
    assert new == newcomer


# --- the baseline moves only on delivery ------------------------------------------------------


def test_a_steady_node_stays_compact_after_delivered_deltas():
    state = acknowledged(node_report())
    for _ in range(3):
        sent, baseline = state.compact(node_report())
        state.delivered(baseline, DELTA)
    sent, _ = state.compact(node_report())
    assert sent["host"] is None
    kept = only_rank(sent)
    assert (kept["stack"], kept["sockets"], kept["env"], kept["cmdline"]) == (None, None, {}, "")
    assert kept["progress"]["recent"] == []


def test_two_compactions_without_delivery_both_carry_the_change_since_the_acknowledged_one():
    state = acknowledged(node_report())
    first = node_report(
        rank_of(stack=stack(110.0), env=NEW_ENV, progress=progress(4, 4, recent=RECENT + [(101.0, 4)])),
        host=NEW_HOST,
    )
    second = node_report(
        rank_of(stack=stack(110.0), env=NEW_ENV, progress=progress(5, 5, recent=RECENT + [(101.0, 4), (102.0, 5)])),
        host=NEW_HOST,
    )
    sent_first, _ = state.compact(first)  # lost: never delivered
    sent_second, baseline = state.compact(second)
    for sent, points in ((sent_first, [[101.0, 4]]), (sent_second, [[101.0, 4], [102.0, 5]])):
        kept = only_rank(sent)
        assert sent["host"] == NEW_HOST
        assert kept["stack"] == stack(110.0)
        assert kept["env"] == NEW_ENV
        assert kept["progress"]["recent"] == points
        assert kept["sockets"] is None and kept["cmdline"] == ""
    # Once the second is acknowledged, the same facts are not sent again.
    state.delivered(baseline, DELTA)
    kept = only_rank(state.compact(copy.deepcopy(second))[0])
    assert kept["stack"] is None and kept["env"] == {} and kept["progress"]["recent"] == []


def test_send_full_makes_the_next_report_full_once():
    state = acknowledged(node_report())
    sent, baseline = state.compact(node_report())
    assert sent["delta"] is True
    state.delivered(baseline, {"delta": True, "send_full": True})
    full = node_report()
    sent, baseline = state.compact(full)
    assert sent == full and "delta" not in sent
    state.delivered(baseline, DELTA)
    assert state.compact(node_report())[0]["delta"] is True


# --- when the owed full report goes: the monitor's slot, or the agent's own spread ---------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def paced(answer: dict, rng: float = 0.5) -> tuple[DeltaState, Clock]:
    """A state that sent a delta (after a delivered full report) and got ``answer`` back."""
    clock = Clock()
    state = DeltaState(clock=clock, rng=lambda: rng)
    state.delivered(state.compact(node_report())[1], DELTA)
    sent, baseline = state.compact(node_report())
    assert sent["delta"] is True
    state.delivered(baseline, answer)
    return state, clock


def is_full(state: DeltaState) -> bool:
    return "delta" not in state.compact(node_report())[0]


def test_deltas_go_on_until_the_slot_the_monitor_gave_then_one_full_report():
    state, clock = paced({"delta": True, "send_full": True, "full_in_s": 2.5})
    assert state.take_spread_s() == 0.0  # the monitor chose the time: no spread of the agent's own
    for _ in range(2):
        assert not is_full(state)
        clock.now += 1.0
    assert not is_full(state)  # 2.0 s: not yet
    clock.now += 0.5
    full = node_report()
    sent, baseline = state.compact(full)
    assert sent == full
    state.delivered(baseline, DELTA)
    assert not is_full(state)  # once


def test_each_answer_restates_the_slot():
    state, clock = paced({"delta": True, "send_full": True, "full_in_s": 5.0})
    clock.now += 1.0
    sent, baseline = state.compact(node_report())
    state.delivered(baseline, {"delta": True, "send_full": True, "full_in_s": 0.0})  # due now
    assert is_full(state)


@pytest.mark.parametrize("given, wait", [
    (0, 0.0), (3, 3.0), (0.25, 0.25), (1e9, 60.0),  # bounded: never starved of a full report
    (-1, 0.0), ("3", 0.0), (None, 0.0), (float("nan"), 0.0), (True, 0.0), ([1], 0.0),
], ids=["zero", "int", "fraction", "huge", "negative", "text", "null", "nan", "bool", "list"])
def test_the_monitors_wait_is_read_within_bounds(given, wait, caplog):
    state, clock = paced({"delta": True, "send_full": True, "full_in_s": given})
    if wait:
        clock.now += wait - 0.01
        assert not is_full(state)
        clock.now += 0.01
    assert is_full(state)
    invalid = wait == 0.0 and given != 0
    assert ("not a number of seconds" in caplog.text) is invalid


def test_a_monitor_that_does_not_say_when_gets_the_full_report_spread_by_the_agent():
    state, _ = paced({"delta": True, "send_full": True}, rng=0.7)
    assert is_full(state)  # the next report is full ...
    assert state.take_spread_s() == pytest.approx(0.7)  # ... held 0.7 of the 1 s interval first
    assert state.take_spread_s() == 0.0  # once


def test_the_spread_is_a_part_of_the_agents_own_interval():
    state = DeltaState(rng=lambda: 0.5)
    state.compact(node_report(agent={"version": "0.1.0", "pid": 42, "interval_s": 4.0}))
    state.reset(spread=True)
    assert state.take_spread_s() == pytest.approx(2.0)
    state.reset()
    assert state.take_spread_s() == 0.0  # another monitor, a new run: no fleet coming back together


def test_reset_makes_the_next_report_full_and_forgets_delta_support():
    state = acknowledged(node_report())
    state.reset()
    assert state.monitor_takes_deltas is False
    full = node_report()
    sent, baseline = state.compact(full)
    assert sent == full and "delta" not in sent
    # The new monitor answers without "delta": reports stay full.
    state.delivered(baseline, {})
    assert "delta" not in state.compact(node_report())[0]
    # Until it says it takes them.
    state.delivered(state.compact(node_report())[1], DELTA)
    assert state.compact(node_report())[0]["delta"] is True


def test_compact_does_not_touch_the_full_report():
    state = acknowledged(node_report())
    full = node_report()
    before = copy.deepcopy(full)
    state.compact(full)
    assert full == before


# --- the monitor can read what is sent ------------------------------------------------------------


@pytest.mark.parametrize(
    "later",
    [
        node_report(),
        node_report(rank_of(stack=stack(110.0), sockets=NEW_SOCKETS), host=NEW_HOST),
        node_report(rank_of(), rank_of(job_id="job-b", rank=1, pid=1101)),
    ],
    ids=["unchanged", "changed", "new rank"],
)
def test_compacted_reports_validate(later):
    sent, _ = acknowledged(node_report()).compact(copy.deepcopy(later))
    parsed = Report.model_validate(sent)
    assert parsed.delta is True
    assert parsed.ranks[0].job_id == "job-a" and parsed.ranks[0].pid == 1000


def test_a_fully_compacted_report_reads_as_unchanged():
    sent, _ = acknowledged(node_report()).compact(node_report())
    parsed = Report.model_validate(sent)
    assert parsed.host is None and parsed.nccl_ras is None
    first = parsed.ranks[0]
    assert first.stack is None and first.sockets is None and first.env == {} and first.cmdline == ""
    assert first.progress is not None and first.progress.recent == []
