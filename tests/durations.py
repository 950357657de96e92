"""The order in which pytest-xdist hands the suite out: the longest work first (tests/conftest.py).

On 2 cores the suite is bound by CPU until its last minute; what sets the wall time then is its tail,
a long test started last running alone while the other workers sit idle. So each unit of work (an
xdist group, else a test) is handed out by how long it took last time, longest first: the quick
tests fill the gaps at the end.

How long each test took (setup, call and teardown) is kept in pytest's cache (``.pytest_cache``)
at the end of every run, by the process that saw the reports (the controller under xdist). A clean
clone (CI) has no cache: it starts from ``tests/durations.json``, the tests of a second or more as
one run timed them (refresh it with ``python -m tests.durations`` after a run, when tests that take
long were added or moved). A test timed nowhere is estimated from its tier. The controller reads the cache once and hands the same
figures to every worker (``pytest_configure_node``): the workers must all sort the collection the
same way, whatever another run writes to the cache meanwhile.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CACHE_KEY = "hangwatch/durations"
WORKER_INPUT_KEY = "hangwatch_durations"
SHIPPED = Path(__file__).resolve().with_name("durations.json")
# Tests shorter than this are left out of the shipped file: their order matters little.
SHIPPED_FROM_S = 1.0


def plain_id(nodeid: str) -> str:
    """The node id without the ``@group`` suffix pytest-xdist adds (as its own loadgroup reads it)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def read(config: pytest.Config) -> dict[str, float]:
    """The figures for this process: the controller's, in a worker; the cache's, elsewhere."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return dict(workerinput.get(WORKER_INPUT_KEY) or {})
    cache = getattr(config, "cache", None)  # absent with -p no:cacheprovider
    return {**_figures(_shipped()), **_figures(cache.get(CACHE_KEY, {}) if cache is not None else {})}


def _figures(found: object) -> dict[str, float]:
    if not isinstance(found, dict):
        return {}
    return {k: float(v) for k, v in found.items() if isinstance(k, str) and isinstance(v, (int, float))}


def _shipped() -> object:
    try:
        return json.loads(SHIPPED.read_text())
    except (OSError, ValueError):
        return {}


class Recorder:
    """A plugin (controller only): adds up each test's phases as the reports come, and merges them
    into the cache at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.taken: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        key = plain_id(report.nodeid)
        self.taken[key] = self.taken.get(key, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.taken:
            return
        root = self.config.rootpath
        merged = {k: v for k, v in read(self.config).items() if (root / k.split("::")[0]).exists()}
        merged.update({k: round(v, 2) for k, v in self.taken.items()})
        cache.set(CACHE_KEY, merged)


def longest_first(items: list[pytest.Item], known: dict[str, float], unit_of: Callable[[pytest.Item], str],
                  estimate: Callable[[pytest.Item], float]) -> None:
    """Sort ``items`` in place: each unit's tests together, units by their total time, longest first
    (ties in collection order)."""
    total: dict[str, float] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        unit = unit_of(item)
        took = known.get(plain_id(item.nodeid))
        total[unit] = total.get(unit, 0.0) + (took if took is not None else estimate(item))
        first.setdefault(unit, index)
    items.sort(key=lambda item: (-total[unit_of(item)], first[unit_of(item)]))


def ship(cache_file: Path = Path(".pytest_cache/v") / CACHE_KEY) -> int:
    """Write tests/durations.json from this checkout's last run (the tests of SHIPPED_FROM_S or more)."""
    try:
        taken = _figures(json.loads(cache_file.read_text()))
    except (OSError, ValueError) as exc:
        print(f"no durations to ship: {exc} (run the suite first)", file=sys.stderr)
        return 1
    kept = {k: round(v, 1) for k, v in sorted(taken.items()) if v >= SHIPPED_FROM_S}
    SHIPPED.write_text(json.dumps(kept, indent=0) + "\n")
    print(f"{SHIPPED}: {len(kept)} tests")
    return 0


if __name__ == "__main__":
    sys.exit(ship())
