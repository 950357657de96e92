"""The stall threshold from the job's pace (monitor.diagnosis.cadence), table-style."""

from __future__ import annotations

import pytest

from monitor.diagnosis.cadence import job_cadence
from tests.diagnosis.builders import NOW, job, rank


def sightings(every: float, per_sighting: int, count: int = 20) -> tuple[float, ...]:
    """Progress as the agent reports it: ``per_sighting`` events stamped with each read time."""
    return tuple(NOW - every * i for i in reversed(range(count)) for _ in range(per_sighting))


CASES = {
    # 16 steps a second read once a second: three silent sightings (3 s) are telling; the floor is 3.5 s.
    "fast steps seen every second": (sightings(1.0, 16), 3.5, 1.0 / 16),
    # One step per sighting: the step time is the sighting gap; 5x it.
    "1 s steps": (sightings(1.0, 1), 5.0, 1.0),
    "8 s steps": (sightings(8.0, 1), 40.0, 8.0),
    # An agent reading every 5 s, many steps each time: 3 sightings, 15 s.
    "fast steps, agent every 5 s": (sightings(5.0, 50), 15.0, 0.1),
}


@pytest.mark.parametrize("progress,stall_after,pace", CASES.values(), ids=CASES.keys())
def test_stall_threshold(progress, stall_after, pace) -> None:
    cadence = job_cadence(job(rank(0), rank(1), progress=progress))
    assert cadence.stall_after_s == pytest.approx(stall_after)
    assert cadence.step_pace_s == pytest.approx(pace)
