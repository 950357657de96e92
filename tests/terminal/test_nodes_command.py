"""`hangwatch nodes`: sharded monitors' suspect nodes merged, the table, and its errors."""

from __future__ import annotations

import subprocess

import pytest

from hangwatch.cli import _duration
from hangwatch.demo.harness import free_port, tool
from hangwatch.nodes_command import merge, render


def node(name: str, jobs: list[str], incidents: int, verdicts: dict[str, int], last_at: float) -> dict:
    return {"node": name, "jobs": jobs, "incidents": incidents, "verdicts": verdicts, "last_at": last_at}


def test_sharded_answers_add_up_per_node() -> None:
    shard_a = [node("gpu-1", ["a1", "a2"], 2, {"deadlock": 2}, 100.0), node("gpu-2", ["a3"], 1, {"straggler": 1}, 50.0)]
    shard_b = [node("gpu-2", ["b1", "b2"], 3, {"straggler": 1, "rank_exited": 2}, 300.0)]
    merged = merge([shard_a, shard_b])
    assert [(n["node"], n["jobs"], n["incidents"]) for n in merged] == [
        ("gpu-2", ["a3", "b1", "b2"], 4), ("gpu-1", ["a1", "a2"], 2)]
    assert merged[0]["verdicts"] == {"straggler": 2, "rank_exited": 2} and merged[0]["last_at"] == 300.0


def test_the_table_puts_the_most_jobs_first_and_escapes_names() -> None:
    text = render(merge([[node("gpu-1\x1b[2J", ["a"], 1, {"deadlock": 1}, 90.0),
                          node("gpu-2", ["b", "c"], 2, {"deadlock": 1, "straggler": 1}, 40.0)]]), 7 * 86400, 100.0)
    lines = text.splitlines()
    assert lines[0] == "nodes named as culprits in the last 7d, most distinct jobs first:"
    assert lines[1].split()[:4] == ["NODE", "JOBS", "INCIDENTS", "VERDICTS"]
    assert lines[2].startswith("gpu-2 ") and lines[2].endswith("b, c") and "1m ago" in lines[2]
    assert "\x1b" not in text and lines[3].startswith("gpu-1")
    assert render([], 3600, 0.0) == "no node was named as a culprit in the last 1h\n"


@pytest.mark.parametrize("text,seconds", [("90", 90.0), ("30m", 1800.0), ("12h", 43200.0), ("7d", 604800.0)])
def test_durations(text: str, seconds: float) -> None:
    assert _duration(text) == seconds


@pytest.mark.parametrize("window", ["0", "-1d", "week", "7w"])
def test_a_bad_window_is_a_usage_error(window: str) -> None:
    done = subprocess.run([tool("hangwatch"), "nodes", "--window", window], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--window" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_an_unreachable_monitor_is_named_and_exits_2() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run([tool("hangwatch"), "nodes", "--monitor", url, "--timeout", "2"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and url in done.stderr and "unreachable" in done.stderr, done.stderr
    assert done.stdout == ""
