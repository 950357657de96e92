"""The real hangwatch-relay in front of the real monitor: reports pass, junk stops at the relay, a
monitor that is away is said to the agents, concurrent posts go in batches."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from monitor_reports import rank, report
from prometheus_client.parser import text_string_to_metric_families
from real_monitor import RELAY_EXE, running_monitor, running_relay

from hangwatch.demo.harness import free_port
from tests.notify_socket import NotifySocket

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

REPORTS = "/api/v1/reports"
AGENTS = "agents-token-0123456789abcdef"
NODE_A = "node-a-token-0123456789abcdef"
RELAY = "relay-token-0123456789abcdef"


def samples(base: str, name: str, headers: dict | None = None) -> dict[tuple, float]:
    text = httpx.get(f"{base}/metrics", headers=headers).text
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def secret(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_reports_through_a_relay_reach_the_monitor_and_junk_stops_at_the_relay(tmp_path: Path) -> None:
    with running_monitor(tmp_path) as monitor, running_relay(tmp_path, monitor.base) as relay:
        answer = httpx.post(relay.base + REPORTS, json=report(ranks=[rank(rank=0), rank(rank=1)]))
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"accepted": True, "ranks": 2, "delta": True, "send_full": False, "replay": True}
        # A delta from a node the monitor has no full report of: the monitor's "send full" comes back.
        delta = httpx.post(relay.base + REPORTS, json=report(node="node-b", delta=True, ranks=[rank(rank=1)]))
        assert delta.status_code == 202 and delta.json()["send_full"] is True, delta.text
        jobs = httpx.get(monitor.base + "/diagnose", params={"format": "json"}).json()["jobs"]
        assert [(j["job_id"], sorted(r["rank"] for r in j["ranks"])) for j in jobs] == [("job-a", [0, 1])]

        junk = httpx.post(relay.base + REPORTS, json={"node": "node-a", "sent_at": 1.0})
        assert junk.status_code == 422 and "schema_version" in junk.json()["detail"], junk.text
        not_json = httpx.post(relay.base + REPORTS, content=b"{", headers={"content-type": "application/json"})
        assert not_json.status_code == 422
        assert samples(relay.base, "hangwatch_relay_reports_total")[(("outcome", "refused"), ("reason", "schema"))] == 1
        # The monitor never saw them: its refusals stay at none.
        refused = samples(monitor.base, "hangwatch_reports_rejected_total")
        assert refused and sum(refused.values()) == 0, refused
        # People read the monitor, not the relay.
        elsewhere = httpx.get(relay.base + "/diagnose")
        assert elsewhere.status_code == 404 and monitor.base in elsewhere.json()["detail"]


def test_a_relay_checks_node_tokens_and_presents_its_own_token_to_the_monitor(tmp_path: Path) -> None:
    # Whether the monitor believes the relay's node checks: tests/monitor/test_report_batches.py.
    agents = secret(tmp_path / "agents.tokens", f"{AGENTS}\nnode-a {NODE_A}\n")
    relay_file = secret(tmp_path / "relay.tokens", f"{RELAY}\n")
    presented = secret(tmp_path / "relay.token", f"{RELAY}\n")
    with running_monitor(tmp_path, "--token-file", agents, "--relay-token-file", relay_file) as monitor, \
            running_relay(tmp_path, monitor.base, "--token-file", agents, "--relay-token-file", presented) as relay:
        bearer = {"authorization": f"Bearer {NODE_A}"}
        assert httpx.post(relay.base + REPORTS, json=report(node="node-a")).status_code == 401
        other = httpx.post(relay.base + REPORTS, json=report(node="node-b"), headers=bearer)
        assert other.status_code == 403 and "node-a" in other.json()["detail"], other.text
        assert httpx.post(relay.base + REPORTS, json=report(node="node-a"), headers=bearer).status_code == 202
        # Agents' tokens do not open the batch path of a monitor that has relay tokens.
        batch = httpx.post(monitor.base + "/api/v1/report-batches", content=b'{"reports":[]}',
                           headers={"content-type": "application/json", "authorization": f"Bearer {AGENTS}"})
        assert batch.status_code == 401
        # Only an agent's capture upload passes through, with the agent's token; no other path does.
        sneaky = httpx.post(relay.base + "/api/v1/capture-uploads/../../api/v1/report-batches",
                            content=b'{"reports":[]}', headers={"content-type": "application/json", **bearer})
        assert sneaky.status_code == 404, sneaky.text
        assert httpx.get(relay.base + REPORTS, headers=bearer).status_code == 405


def test_a_relay_with_a_token_of_its_own_but_none_for_the_agents_refuses_to_start(tmp_path: Path) -> None:
    presented = secret(tmp_path / "relay.token", f"{RELAY}\n")
    done = subprocess.run([RELAY_EXE, "--monitor", "http://127.0.0.1:9", "--relay-token-file", presented],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--token-file" in done.stderr, done


def test_a_relay_tells_agents_the_monitor_is_away_and_forwards_again_after(tmp_path: Path) -> None:
    port = free_port()
    with running_relay(tmp_path, f"http://127.0.0.1:{port}") as relay:
        away = httpx.post(relay.base + REPORTS, json=report())
        # A gateway error, not a 503 to come back later: the agent keeps its outage journal.
        assert away.status_code == 502 and "retry-after" not in away.headers, away.text
        assert "unreachable" in away.json()["detail"]
        with running_monitor(tmp_path, port=port):
            back = httpx.post(relay.base + REPORTS, json=report(sent_at=time.time()))
            assert back.status_code == 202, back.text
        counts = samples(relay.base, "hangwatch_relay_reports_total")
        assert counts[(("outcome", "monitor_unreachable"), ("reason", ""))] == 1
        assert counts[(("outcome", "answered"), ("reason", ""))] == 1


def test_many_nodes_posting_at_once_go_to_the_monitor_in_a_few_batches(tmp_path: Path) -> None:
    nodes = 200

    async def post_all(base: str) -> list[int]:
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
            answers = await asyncio.gather(*(client.post(REPORTS, json=report(
                node=f"node-{i}", ranks=[rank(rank=i, world_size=nodes, job_id="big")])) for i in range(nodes)))
        return [a.status_code for a in answers]

    # Half a second per batch: on a loaded machine the 200 posts may take over a second to arrive.
    with running_monitor(tmp_path) as monitor, running_relay(tmp_path, monitor.base, "--flush-ms", "500") as relay:
        assert asyncio.run(post_all(relay.base)) == [202] * nodes
        [job] = httpx.get(monitor.base + "/diagnose", params={"format": "json", "job": "big"}).json()["jobs"]
        assert job["ranks_total"] == nodes, job["ranks_total"]
        batches = samples(relay.base, "hangwatch_relay_batches_total")[()]
        assert 1 <= batches < nodes / 4, batches


def test_under_systemd_a_relay_says_ready_and_feeds_the_watchdog(tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    try:
        with running_relay(tmp_path, "http://127.0.0.1:9", extra_env=notify.env(watchdog_usec=2_000_000)):
            said = notify.wait_until(lambda messages: sum("WATCHDOG=1" in m for m in messages) >= 2)
    finally:
        notify.close()
    assert any("READY=1" in m and "relaying to http://127.0.0.1:9" in m for m in said), said
