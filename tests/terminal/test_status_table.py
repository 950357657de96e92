"""hangwatch/status_table.py: the cells of a job's row, cutting wide values, and the table's alignment."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from hangwatch.status_table import age, culprits_cell, fit, job_cells, progress_cell, ranks_cell, render_table
from hangwatch_common.safe_text import one_line

NOW = 1_000_000.0


def job(job_id: str = "10.0.0.1:29500", verdict: str = "deadlock", **fields) -> dict:
    base = {
        "job_id": job_id, "verdict": verdict, "since": NOW - 75, "culprit_ranks": [1], "world_size": 4,
        "ranks": [{"rank": 0, "node": "node-a"}, {"rank": 1, "node": "node-b"}],
        "nodes": ["node-a", "node-b"], "job_step": 30, "last_progress_at": NOW - 80, "now": NOW,
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"), (-3, "0s"), (0, "0s"), (45.9, "45s"), (119, "119s"), (120, "2m"), (7199, "119m"),
    (7200, "2h"), (172799, "47h"), (172800, "2d"),
])
def test_age(seconds, shown):
    assert age(seconds) == shown


@pytest.mark.parametrize(("text", "width", "shown"), [
    ("short", 10, "short"),
    ("exactly-10", 10, "exactly-10"),
    ("eleven-long", 10, "eleven-lo…"),
    ("节点节点节点", 6, "节点…"),  # two cells each: never half a character
    ("a节点", 3, "a…"),
])
def test_fit_cuts_with_an_ellipsis_to_the_width(text, width, shown):
    assert fit(text, width) == shown
    assert cell_len(fit(text, width)) <= width


@pytest.mark.parametrize(("fields", "shown"), [
    ({}, "1@node-b"),
    ({"culprit_ranks": []}, "-"),
    ({"culprit_ranks": [1, 3, 0], "ranks": [{"rank": 0, "node": "a"}, {"rank": 1, "node": "b"},
                                            {"rank": 3, "node": "b"}]}, "1,3@b 0@a"),
    ({"culprit_ranks": [7]}, "7@?"),  # a culprit that never reported (rendezvous): no node known
    # Many culprits (a rendezvous missing whole nodes): the ranks as runs and a count, no node.
    ({"culprit_ranks": list(range(16, 48)), "ranks": []}, "ranks 16-47 (32)"),
    ({"culprit_ranks": [1, 9, 17, 25], "ranks": [{"rank": r, "node": f"n{r // 8}"} for r in (1, 9, 17, 25)]},
     "ranks 1,9,17,25 (4)"),
])
def test_culprits_cell_names_each_culprit_node(fields, shown):
    assert culprits_cell(job(**fields)) == shown


@pytest.mark.parametrize(("fields", "shown"), [
    ({}, "2/4"),
    ({"world_size": None}, "2"),
    ({"ranks": []}, "0/4"),
    ({"ranks_total": 10_000, "world_size": 10_000}, "10000/10000"),  # a giant job lists 256 of them
])
def test_ranks_cell(fields, shown):
    assert ranks_cell(job(**fields)) == shown


@pytest.mark.parametrize(("fields", "shown"), [
    ({}, "step 30, 80s ago"),
    ({"job_step": None}, "80s ago"),
    ({"last_progress_at": None}, "step 30"),
    ({"last_progress_at": None, "job_step": None}, "-"),
    ({"last_progress_at": NOW - 3 * 3600}, "step 30, 3h ago"),
])
def test_progress_cell(fields, shown):
    assert progress_cell(job(**fields), NOW) == shown


def test_row_cells_in_column_order_with_the_monitors_clock():
    assert job_cells(job()) == ["10.0.0.1:29500", "DEADLOCK", "75s", "1@node-b", "2/4", "2", "step 30, 80s ago"]
    assert job_cells(job(since=None), "http://m:8787")[2::5] == ["-", "http://m:8787"]


HOSTILE = [
    "job\x1b[2J\x1b]0;pwned\x07",  # clear the screen, set the title
    "job\r\nJOB fake  HEALTHY",  # a fake row
    "job\u202eevil\u202c",  # bidi override
    "job\x9b31m\x85",  # C1 controls
]


@pytest.mark.parametrize("job_id", HOSTILE)
def test_no_control_character_reaches_the_table(job_id):
    hostile_node = [{"rank": 1, "node": "node\x1b[31m"}]
    text = render_table([(job(job_id, ranks=hostile_node), None)])
    assert one_line(text.replace("\n", "")) == text.replace("\n", "")  # nothing left to escape
    assert len(text.splitlines()) == 2


def _cell_starts(line: str) -> list[int]:
    """Where (in terminal cells) each run of text after a two-space gap starts."""
    starts, at = [0], 0
    for i, ch in enumerate(line):
        if ch != " " and line[max(0, i - 2):i] == "  ":
            starts.append(at)
        at += cell_len(ch)
    return starts


@pytest.mark.parametrize(("rows", "cut"), [
    ([(job(), None), (job("x" * 200, "healthy", culprit_ranks=[]), None)], [0, 1]),
    ([(job("作业" * 40), None), (job("j"), None)], [1, 0]),
    ([(job(), "http://monitor-a:8787"), (job("b", ranks=[{"rank": 1, "node": "n" * 90}]), "http://" + "m" * 80)],
     [0, 2]),
])
def test_columns_line_up_whatever_the_widths(rows, cut):
    lines = render_table(rows).splitlines()
    header_starts = _cell_starts(lines[0].replace("LAST PROGRESS", "LAST_PROGRESS"))
    assert len(header_starts) == (8 if rows[0][1] else 7)
    for line in lines[1:]:
        # Every column's title starts a cell of each row (a cell may hold spaces itself: "step 30, 80s ago").
        assert set(header_starts) <= set(_cell_starts(line)), (lines[0], line)
    assert [line.count("…") for line in lines[1:]] == cut
    assert max(cell_len(line) for line in lines) < 220


def test_no_monitor_column_for_one_monitor_and_colour_only_on_the_verdict():
    plain = render_table([(job(), None)])
    assert "MONITOR" not in plain
    painted = render_table([(job(), None)], lambda text, verdict: f"<{verdict}>{text}</>")
    assert "<deadlock>DEADLOCK" in painted
    # The colour codes wrap the padded cell: the columns after it are where they were.
    assert painted.replace("<deadlock>", "").replace("</>", "") == plain


def test_a_name_column_only_when_some_job_has_a_name_people_use():
    assert "NAME" not in render_table([(job(), None)]).splitlines()[0]
    lines = render_table([(job(names={"display": "slurm job 4242.0 (llama)"}), None),
                          (job("b", names={}), None)]).splitlines()
    assert lines[0].split()[:3] == ["JOB", "NAME", "VERDICT"]
    assert "slurm job 4242.0 (llama)  DEADLOCK" in lines[1]
    assert lines[2].split()[:3] == ["b", "-", "DEADLOCK"]
    assert set(_cell_starts(lines[0].replace("LAST PROGRESS", "LAST_PROGRESS"))) <= set(_cell_starts(lines[2]))
