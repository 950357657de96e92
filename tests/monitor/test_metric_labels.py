"""Every per-rank family carries the same labels: job_id, rank and node (a table, one row per family).

Before, ``node`` was on some per-rank families and not on others, so a query could group CPU by node
but not steps. The table here is the contract; docs/operations.md's series table must say the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from monitor_reports import frame, progress, rank, report, stack
from monitor_testkit import FakeClock, TestClient
from prometheus_client.parser import text_string_to_metric_families

from monitor.web.metrics import RANK_LABELS

SERIES_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
COMMON = ("job_id", "rank", "node")
# Every per-rank family as scraped (sample name) -> the labels it has beyond the common ones.
PER_RANK = {
    "hangwatch_rank_state": ("state",),
    "hangwatch_rank_culprit": (),
    "hangwatch_rank_alive": (),
    "hangwatch_rank_step": (),
    "hangwatch_rank_last_progress_timestamp_seconds": (),
    "hangwatch_rank_cpu_seconds_total": (),
    "hangwatch_rank_cpu_ratio": (),
    "hangwatch_rank_collective_wait_ratio": (),
}


@pytest.fixture
def scraped(client: TestClient, clock: FakeClock) -> dict[str, list[dict[str, str]]]:
    """A two-node job whose every rank has what each per-rank family needs: progress, CPU, stacks."""
    compute = [frame("forward", "/work/model.py", 20), frame("train_step", "/work/train.py", 48)]
    for second in range(5):  # five stacks per rank: the fewest a collective-wait share is given for
        recent = [(clock.now - 1, 10 + second)]
        for node, ranks in (("node-a", (0, 1)), ("node-b", (2, 3))):
            body = [rank(rank=r, world_size=4, progress=progress(second + 1, 10 + second, recent),
                         stack=stack(clock.now, frames=compute if r % 2 else None, active=bool(r % 2)))
                    for r in ranks]
            assert client.post("/api/v1/reports", json=report(node=node, ranks=body,
                                                               sent_at=clock.now)).status_code == 202
        clock.advance(1)
    response = client.get("/metrics")
    assert response.status_code == 200
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s.labels)
    return samples


def test_the_monitor_names_the_common_labels() -> None:
    assert RANK_LABELS == COMMON


@pytest.mark.parametrize("family", sorted(PER_RANK))
def test_per_rank_family_has_the_common_labels(family: str, scraped: dict[str, list[dict[str, str]]]) -> None:
    series = scraped.get(family)
    assert series, f"{family} has no series for a job with progress, CPU and stacks"
    for labels in series:
        assert set(labels) == {*COMMON, *PER_RANK[family]}, (family, labels)
    # The node is the one the rank runs on, not a placeholder.
    assert {(s["rank"], s["node"]) for s in series} == {("0", "node-a"), ("1", "node-a"), ("2", "node-b"),
                                                         ("3", "node-b")}


def test_every_per_rank_family_is_in_the_table(scraped: dict[str, list[dict[str, str]]]) -> None:
    """A new hangwatch_rank_* family must join the table (and so be held to the common labels)."""
    assert {name for name in scraped if name.startswith("hangwatch_rank_")} == set(PER_RANK)


def test_the_documented_series_table_says_the_same() -> None:
    rows = re.findall(r"^\| `(hangwatch_rank_\w+)` \| ([^|]+) \|", SERIES_DOC.read_text(), re.MULTILINE)
    documented = {name: tuple(re.findall(r"`(\w+)`", cell)) for name, cell in rows}
    assert documented == {name: (*COMMON, *extra) for name, extra in PER_RANK.items()}
