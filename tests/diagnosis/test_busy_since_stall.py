"""A busy CPU reading counts as work after a stall began only for the part of its interval after it
(monitor/diagnosis/stall.busy_since_stall): the agent measures CPU over the interval since its report
before, and at one report every 10 s most of that can predate the fault."""

from __future__ import annotations

import pytest

from monitor.diagnosis.activity import Activity
from monitor.diagnosis.model import RankView
from monitor.diagnosis.stall import busy_since_stall

STALL = 100.0


def computing(cpu: float, cpu_since: float | None, observed_at: float, kind: str = "computing") -> Activity:
    view = RankView(rank=3, node="n", pid=1, alive=True, observed_at=observed_at, first_seen_at=0.0,
                    cpu_percent=cpu, cpu_since=cpu_since)
    return Activity(view, kind)


@pytest.mark.parametrize(("cpu", "cpu_since", "observed_at", "since", "busy"), [
    (95.0, 99.0, 100.0 + 1.0, STALL, True),     # one report a second, at work: busy
    (95.0, 101.0, 102.0, STALL, True),          # the whole reading after the stall began
    (95.0, 91.0, 99.0, STALL, False),           # wholly before it: says nothing yet
    (70.0, 92.0, 102.0, STALL, False),          # 8 s busy before, idle since: 80% over the 10 s
    (100.0, 92.0, 102.0, STALL, True),          # busy throughout: busy after too
    (85.0, 92.0, 102.0, STALL, True),           # 0.5 of the 2 s after at work: 25%
    (95.0, None, 102.0, STALL, True),           # its first reading: taken as it is
    (95.0, 92.0, 102.0, None, True),            # no stall time: taken as it is
])
def test_busy_since_stall(cpu: float, cpu_since: float | None, observed_at: float, since: float | None,
                          busy: bool) -> None:
    assert busy_since_stall(computing(cpu, cpu_since, observed_at), since) is busy


def test_only_a_computing_rank_is_judged_by_its_reading() -> None:
    assert busy_since_stall(computing(5.0, 92.0, 102.0, kind="writing"), STALL)
