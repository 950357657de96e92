"""The pacing of owed full reports (monitor/ingest/full_pacing.py): pure, on a hand-made clock."""

from __future__ import annotations

import collections

import pytest

from monitor.ingest.full_pacing import FORGET_AFTER_S, FullReportPacer, slot_fraction

NODES = [f"node-{i:05d}" for i in range(20_000)]


def herd(nodes: int, expected: int = 0) -> dict[str, float]:
    """When each of ``nodes`` agents sends its full report (seconds from the herd's first ask), each
    reporting once a second at its own phase, as agents do: a delta, answered with the wait; the full
    report at its first report once the wait is over."""
    pacer = FullReportPacer()
    full_at: dict[str, float] = {}
    sent: dict[str, float] = {}
    for tick in range(30):
        for i, node in enumerate(NODES[:nodes]):
            now = tick + i / nodes
            if node in sent:
                continue
            if node in full_at and now >= full_at[node]:
                sent[node] = now
                pacer.paid(node)
            else:
                full_at[node] = now + pacer.wait_s(node, now, expected)
    assert len(sent) == nodes
    return sent


@pytest.mark.parametrize("nodes, expected, last_s", [
    (1, 0, 1.0),  # a node alone (a forgotten one): its next report
    (1_250, 1_250, 2.0),  # a 10,000-rank job after a restart: within a second at 1,500/s, not paced
    (3_000, 3_000, 1.0 + 2.0 + 1.0),  # 24,000 ranks: a lead, 2 s at 1,500/s, a report
    (3_000, 0, 1.0 + 2.0 + 1.0),  # the herd's size unknown: the window grows as it arrives
    (12_500, 12_500, 1.0 + 8.4 + 1.0),  # 100,000 ranks: 8.3 s at 1,500/s
    (20_000, 20_000, 1.0 + 10.0 + 1.0),  # capped: nobody waits more than 10 s
])
def test_every_node_sends_its_full_report_within_the_window(nodes, expected, last_s):
    sent = herd(nodes, expected)
    assert max(sent.values()) <= last_s
    if nodes > 1_500:
        assert max(sent.values()) >= 0.8 * last_s  # spread over the window, not bunched early


@pytest.mark.parametrize("nodes, expected, most_per_s", [
    (3_000, 3_000, 1_800),  # about the 1,500 a second aimed at
    (3_000, 0, 3_000),  # unknown size: the first nodes get no window, as a small herd
    (12_500, 12_500, 1_800),
    (20_000, 20_000, 2_400),  # capped: 20,000 over 10 s
])
def test_full_reports_come_at_about_the_target_rate(nodes, expected, most_per_s):
    per_quarter_s = collections.Counter(int(t * 4) for t in herd(nodes, expected).values())
    assert max(per_quarter_s.values()) * 4 <= most_per_s, sorted(per_quarter_s.items())


def test_a_retried_post_gets_the_same_slot():
    pacer = FullReportPacer()
    first = pacer.wait_s("node-00007", 100.0, expected=3_000)
    assert pacer.wait_s("node-00007", 100.0, expected=3_000) == first
    assert pacer.wait_s("node-00007", 101.0, expected=3_000) == pytest.approx(max(0.0, first - 1.0), abs=1e-3)


def test_slots_are_the_same_in_every_process_and_in_range():
    assert slot_fraction("node-00000") == slot_fraction("node-00000")
    fractions = [slot_fraction(n) for n in NODES]
    assert all(0.0 <= f < 1.0 for f in fractions)
    assert 0.45 < sum(fractions) / len(fractions) < 0.55


def test_the_window_never_shrinks_while_the_herd_lasts():
    pacer = FullReportPacer()
    late = max(NODES[:3_000], key=slot_fraction)
    for node in NODES[:3_000]:
        pacer.wait_s(node, 0.0)
    told = pacer.wait_s(late, 0.5)
    assert told > 2.0
    for node in NODES[:3_000]:
        if node != late:
            pacer.paid(node)
    assert pacer.owing == 1
    assert pacer.wait_s(late, 0.5) == told  # the others paid: its slot stays where it was


def test_a_new_herd_starts_once_every_node_paid():
    pacer = FullReportPacer()
    for node in NODES[:1_250]:
        pacer.wait_s(node, 0.0)
    for node in NODES[:1_250]:
        pacer.paid(node)
    assert pacer.owing == 0
    assert pacer.wait_s("node-99999", 500.0) <= 0.004  # alone, long after: at once


def test_nodes_that_stopped_asking_leave_the_herd():
    pacer = FullReportPacer()
    for node in NODES[:1_000]:
        pacer.wait_s(node, 0.0)
    pacer.wait_s("node-late", FORGET_AFTER_S + 1.5)
    assert pacer.owing == 1
