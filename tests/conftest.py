"""Suite-wide set-up for running the tests in parallel (pytest-xdist, scripts/test.sh).

- Each worker is a node of its own: pid 1 of a fresh PID namespace (tests/node_worker.py), so its
  agents see only its own ranks.
- Tests that share a module- or package-scoped fixture (a browser, a Prometheus, one live hang)
  run on one worker, so that fixture is made once (``--dist loadgroup`` honours the group).
- The longest work is handed out first, by how long each test took last time (tests/durations.py):
  a 40-second test started last would keep the suite waiting on one worker while the others sit idle.
- Tiers: tests that start real processes are marked ``live`` (``e2e`` ones, which start torch
  jobs, are live too); ``scripts/test.sh --fast`` runs the rest.
- Network namespaces a killed run left (its workers' fabrics never reached their clean-up) are
  swept by the controller at the start and the end of the session: only it, outside every
  worker's PID namespace, can tell that their makers are gone (tests/netns.py).
- Tests marked ``cpu_bound`` judge ranks by the CPU they get (a busy rank must look busy): beside
  other workers' jobs on 2 cores it gets a fifth of a core. ``--cpu-bound=without`` leaves them out
  and ``--cpu-bound=only`` runs just them; scripts/test.sh runs the parallel part without them, then
  them on two workers: the ones grouped "cpu_bound" one after another on one, the 30%-straggler
  test (grouped on its own) on the other, so a busy rank gets at least half a core.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import cpu_log, durations

TESTS = Path(__file__).resolve().parent
NODE_WORKER = TESTS / "node_worker.py"
# What a test not timed yet is taken to last (seconds), by tier: the long, waiting tests are live ones.
ESTIMATE_LIVE = {"e2e": 25.0, "ops": 10.0}
ESTIMATE_OTHER_LIVE = 3.0
ESTIMATE_NOT_LIVE = 0.05
DURATIONS = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-bound", choices=("with", "without", "only"), default="with",
                     help="tests marked cpu_bound: run them with the rest (default), leave them out, or run only them")


def pytest_configure(config: pytest.Config) -> None:
    cpu_log.register(config)
    # pytest-xdist turns `-n N` into N "popen" specs; each becomes `python tests/node_worker.py ...`.
    tx = getattr(config.option, "tx", None)
    if tx and "PYTEST_XDIST_WORKER" not in os.environ:
        config.option.tx = [f"popen//python={sys.executable} {NODE_WORKER}" if spec == "popen" else spec
                            for spec in tx]
    if not hasattr(config, "workerinput"):
        # Read once, for every worker alike (tests/durations.py); the groups are handed out in the
        # collection's order, which is ours, not re-sorted by their number of tests.
        config.stash[DURATIONS] = durations.read(config)
        config.pluginmanager.register(durations.Recorder(config), "hangwatch-durations")
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: on the controller, for each worker it starts
def pytest_configure_node(node) -> None:  # noqa: ANN001 (xdist's WorkerController)
    node.workerinput[durations.WORKER_INPUT_KEY] = node.config.stash[DURATIONS]


def _sweep_namespaces(config: pytest.Config) -> None:
    """Remove the namespaces of fabrics whose makers are gone, from the controller (or a run
    without workers) as root where ``ip`` exists: a worker never judges another's."""
    if hasattr(config, "workerinput") or os.geteuid() != 0:
        return
    from tests.netns import missing_tools, sweep_stale

    if not missing_tools():
        sweep_stale()


def pytest_sessionstart(session: pytest.Session) -> None:
    _sweep_namespaces(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _sweep_namespaces(session.config)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``--cpu-bound=only``, a test module whose text never names the mark holds no such test:
    not imported at all (the run after the parallel part imports a handful of modules, not the suite)."""
    if config.getoption("cpu_bound") != "only" or collection_path.suffix != ".py" \
            or not collection_path.name.startswith("test_"):
        return None
    try:
        return True if "cpu_bound" not in collection_path.read_text(errors="replace") else None
    except OSError:
        return None


def _shared_fixture_group(item: pytest.Item) -> str | None:
    """The broadest module- or package-scoped fixture the test uses, as a group name."""
    best: tuple[int, str] | None = None
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        fixturedef = defs[-1]
        if fixturedef.scope == "package":
            key = (2, f"package:{fixturedef.baseid}")
        elif fixturedef.scope == "module":
            key = (1, f"module:{item.nodeid.split('::')[0]}")
        else:
            continue
        if best is None or key[0] > best[0]:
            best = key
    return best[1] if best else None


# Every test in these folders starts real processes.
LIVE_FOLDERS = ("e2e", "ops")


def _folder(item: pytest.Item) -> str:
    parts = Path(str(item.path)).relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else ""


def _estimate(item: pytest.Item) -> float:
    """Seconds a test not timed yet is taken to last."""
    if not item.get_closest_marker("live"):
        return ESTIMATE_NOT_LIVE
    return ESTIMATE_LIVE.get(_folder(item), ESTIMATE_OTHER_LIVE)


def _unit(item: pytest.Item) -> str:
    """What pytest-xdist hands out whole: the test's group (named as pytest-xdist names it), else the test."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "@" + "_".join(names) if names else item.nodeid


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (item.get_closest_marker("e2e") or _folder(item) in LIVE_FOLDERS) and not item.get_closest_marker("live"):
            item.add_marker(pytest.mark.live)
        group = _shared_fixture_group(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
        elif item.get_closest_marker("cpu_bound") and not item.get_closest_marker("xdist_group"):
            # One after another on one worker: with scripts/test.sh's two workers for them, at most
            # two such tests share the two cores (the one that compares CPU levels has a group of its own).
            item.add_marker(pytest.mark.xdist_group("cpu_bound"))
    durations.longest_first(items, durations.read(config), _unit, _estimate)
    which = config.getoption("cpu_bound")
    if which != "with":
        keep, drop = [], []
        for item in items:
            (keep if bool(item.get_closest_marker("cpu_bound")) == (which == "only") else drop).append(item)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(trylast=True)  # after pytest-xdist's, which appends "@group" to each grouped item's id
def pytest_collection_finish(session: pytest.Session) -> None:
    if not getattr(session.config.option, "loadgroup", False):  # set in workers under --dist loadgroup
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} tests (e.g. {lost[0]}): this pytest and pytest-xdist do not "
            "work together for --dist loadgroup, so shared fixtures would be made on several workers "
            "(see the pytest pin in pyproject.toml)")
