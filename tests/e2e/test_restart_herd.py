"""A monitor restart under a deadlocked job of two simulated nodes (tests/netns.py): real agents, a real
two-node torchrun job whose rank 1 leaves the loop, the monitor killed (SIGKILL) and started again on
the same database and port.

While the job is rebuilt it is never shown ``healthy`` (the raised deadlock is held, "cannot check
now", or the job is ``unknown``, refreshing); the deadlock is judged again from the agents' fresh
reports within seconds; and each agent sends the restarted monitor one full report, when the monitor
says (its kept reports delivered first, its deltas going on from the last of them until then).
The spread of a herd of them at scale is measured by ``benchmarks/monitor_scale.py --restart``.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.demo.harness import Observation, tool
from tests.e2e import test_multinode as multinode
from tests.e2e.test_multinode import Cluster
from tests.netns import SWITCH_ADDR, Fabric

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LINGER = ("--steps", "100000", "--fail", "linger", "--fail-rank", "1", "--fail-at-step", "40")
# The target for a 10,000-rank job; two nodes take a few seconds.
RIGHT_AGAIN_S = 15.0
HELD_UNCHECKED = "cannot check now"
# Snapshots every few seconds, so that the ones restored hold the job's ranks (at the default minute the
# agents' first ones, taken before the job started, would be all there is).
MONITOR_ARGS = ("--snapshot-interval", "10")


def counters(cluster: Cluster) -> dict[str, float]:
    """The monitor's report counters, read through the fabric's Unix socket."""
    transport = httpx.HTTPTransport(uds=cluster.fabric.monitor_uds)
    with httpx.Client(transport=transport, timeout=5.0) as http:
        scrape = http.get(cluster.fabric.monitor_url + "/metrics")
    assert scrape.status_code == 200, scrape.text[:200]
    wanted = ("hangwatch_monitor_full_reports_total", "hangwatch_monitor_reports_replayed_total")
    return {s.name: s.value for family in text_string_to_metric_families(scrape.text) for s in family.samples
            if s.name in wanted}


def restart_monitor(fabric: Fabric, down_s: float) -> float:
    """Kill the fabric's monitor and start it again on its database and port, with MONITOR_ARGS; when it
    was started."""
    fabric.monitor.proc.send_signal(signal.SIGKILL)
    fabric.monitor.proc.wait(timeout=10)
    time.sleep(down_s)
    port = fabric.monitor_url.rsplit(":", 1)[1]
    with open(fabric.workdir / "monitor.log", "ab") as out:
        fabric.monitor.proc = fabric.reaper.popen(
            ["ip", "netns", "exec", fabric.switch_ns, tool("hangwatch-monitor"), "--host", SWITCH_ADDR, "--port", port,
             "--db", str(fabric.workdir / "monitor.db"), *MONITOR_ARGS], stdout=out, stderr=out)
    return time.time()


def restarted_at_once(c: Cluster) -> None:
    """The monitor started again with MONITOR_ARGS, and answering."""
    restart_monitor(c.fabric, down_s=0.0)
    deadline = time.monotonic() + 30
    while True:
        try:
            c.client.diagnose()
            return
        except httpx.HTTPError:
            assert time.monotonic() < deadline, c.fabric.monitor.log_tail()
            time.sleep(0.2)


def two_nodes(tmp_path: Path) -> contextlib.AbstractContextManager[Cluster]:
    """tests/e2e/test_multinode.py's two nodes, their monitor started with MONITOR_ARGS."""
    return multinode.two_nodes(tmp_path, before_agents=restarted_at_once)


def test_a_restart_under_a_deadlock_never_shows_it_healthy_and_judges_it_again_within_seconds(tmp_path: Path):
    with two_nodes(tmp_path) as c:
        c.launch(c.a, 0, *LINGER)
        c.launch(c.b, 1, *LINGER)
        c.wait_for_verdict("deadlock", timeout=90, culprits=[1])
        time.sleep(1.0)  # the verdict recorded (the store commits on its own thread)

        restarted_at = restart_monitor(c.fabric, down_s=2.0)  # the agents' posts fail: they keep outage journals
        seen: list[Observation] = []
        rebuilt = c.client.wait_for_verdict(c.job_id, "deadlock", timeout=45, culprits=[1], observations=seen,
                                            where=lambda job: HELD_UNCHECKED not in job["summary"],
                                            context=c.context)
        right_again_s = time.time() - restarted_at
        answered = [o for o in seen if o.verdict is not None]
        shown = [f"{o.at - restarted_at:+.1f}s {o.verdict} {list(o.culprits)}: {o.summary[:120]}" for o in answered]
        assert answered, "the restarted monitor never answered for the job"
        # Never a verdict from a half-built picture: the deadlock held, or unknown while refreshing.
        assert {o.verdict for o in answered} <= {"deadlock", "unknown"}, "\n".join(shown)
        assert right_again_s - (answered[0].at - restarted_at) <= RIGHT_AGAIN_S, "\n".join(shown)
        assert rebuilt["culprit_ranks"] == [1]

        # One full report per node to the restarted monitor: the kept reports first, deltas on the last
        # of them, the full report when the monitor said (nothing sent twice, nothing left waiting).
        deadline = time.monotonic() + 10
        while (got := counters(c)).get("hangwatch_monitor_full_reports_total", 0) < 2:
            assert time.monotonic() < deadline, got
            time.sleep(0.5)
        assert got["hangwatch_monitor_full_reports_total"] == 2, got
        assert got["hangwatch_monitor_reports_replayed_total"] >= 2, got  # each agent's journal, delivered
        print(f"restart: answering {answered[0].at - restarted_at:.1f}s, deadlock judged again "
              f"{right_again_s:.1f}s after the restart; counters {got}")
