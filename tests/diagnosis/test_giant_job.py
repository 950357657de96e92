"""A job of thousands of ranks reads like a job of a few: verdicts over groups, evidence in groups."""

from __future__ import annotations

import pytest

from monitor.diagnosis import diagnose
from monitor.diagnosis.context import GROUP_LINES_MAX, RANK_LINES_MAX
from tests.diagnosis.builders import NOW, TRAIN, collective, computing, job, py, rank, sleeping, steps

RANKS = 10_000
PROGRESS = steps(NOW - 30, 1.0)


def _waiting(r: int) -> object:
    return rank(r, cpu=0.5, frames=collective("all_reduce", 97), idle_since=NOW - 25, progress=PROGRESS,
                node=f"node-{r // 8:04d}")


def test_a_deadlock_in_ten_thousand_ranks_names_the_one_that_left_and_groups_the_rest() -> None:
    ranks = [_waiting(r) for r in range(RANKS)]
    ranks[5] = rank(5, cpu=0.5, frames=sleeping(131), idle_since=NOW - 25, progress=PROGRESS, node="node-0000")
    found = diagnose(job(*ranks))
    assert found.verdict == "deadlock" and found.culprit_ranks == (5,)
    assert "ranks 0-4, 6-9999 wait in all_reduce" in found.summary
    # One line per group, the odd one out first: not 10,000 lines.
    assert found.evidence[1:3] == (
        "rank 5 on node-0000: idle, main (train.py:131), 0% CPU",
        "ranks 0-4, 6-9999 on 1250 nodes: in_collective, all_reduce called from train_step (train.py:97), 0% CPU",
    )
    assert len(found.evidence) < 10
    assert len(found.ranks) == RANKS  # every rank keeps its own state for the JSON answer


@pytest.mark.parametrize(("odd_ones", "lines"), [
    (RANK_LINES_MAX - 2, RANK_LINES_MAX),  # a job of RANK_LINES_MAX ranks: a line per rank
    (3, 4),  # 3 distinct odd ranks + the big group
    (GROUP_LINES_MAX + 5, GROUP_LINES_MAX + 1),  # past the cap: "... N more groups"
])
def test_evidence_lines_per_rank_up_to_a_screenful_then_per_group(odd_ones: int, lines: int) -> None:
    size = RANK_LINES_MAX if odd_ones == RANK_LINES_MAX - 2 else 500
    ranks = [_waiting(r) for r in range(size)]
    # Each odd rank is busy somewhere of its own: a group of one each (a straggler situation).
    for i in range(odd_ones):
        ranks[i] = rank(i, cpu=99.0, frames=(py(f"work_{i}", TRAIN, 200 + i), *computing()), progress=PROGRESS,
                        active=True, node=f"node-{i // 8:04d}")
    found = diagnose(job(*ranks))
    assert found.verdict == "straggler"
    assert set(found.culprit_ranks) == set(range(odd_ones))
    described = [e for e in found.evidence if ": " in e and " on " in e.split(":")[0] or e.startswith("... ")]
    assert len(described) == lines, described
    if size > RANK_LINES_MAX and odd_ones > GROUP_LINES_MAX:
        # The smallest groups first, then how many were left out, then the largest group.
        hidden = odd_ones - (GROUP_LINES_MAX - 1)
        assert described[-2] == f"... {hidden} more groups ({hidden} ranks)"
        assert described[-1].startswith(f"ranks {odd_ones}-{size - 1} on ")
