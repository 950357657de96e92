"""A real Prometheus scraping a real monitor during a real deadlock: the alert fires via its API."""

from __future__ import annotations

import re
import subprocess
import time
from urllib.parse import quote_plus

import httpx
import psutil
import pytest

from tests.ops.conftest import LiveHang
from tests.ops.promserver import PROMTOOL

pytestmark = pytest.mark.e2e

ALERT_TIMEOUT = 45.0


def firing(live: LiveHang, name: str) -> list[dict]:
    alerts = live.prometheus.api("/api/v1/alerts")["alerts"]
    return [a for a in alerts if a["labels"].get("alertname") == name and a["state"] == "firing"]


def test_deadlock_alert_fires(live_hang: LiveHang) -> None:
    live = live_hang
    end = time.monotonic() + ALERT_TIMEOUT
    found: list[dict] = []
    while time.monotonic() < end:
        found = [a for a in firing(live, "HangwatchDeadlock") if a["labels"].get("job_id") == live.job.job_id]
        if found:
            break
        time.sleep(0.5)
    assert found, (f"HangwatchDeadlock never fired for {live.job.job_id} within {ALERT_TIMEOUT}s; alerts now: "
                   f"{live.prometheus.api('/api/v1/alerts')}\n{live.context()}")
    alert = found[0]
    assert alert["labels"]["severity"] == "critical"
    # The job as people know it: the monitor's display name (hangwatch_job_info), when it has one.
    display = (live.diagnosis.get("names") or {}).get("display", "")
    (info,) = live.prometheus.query(f'hangwatch_job_info{{job="hangwatch", job_id="{live.job.job_id}"}}')
    assert info["metric"].get("display", "") == display, (info, live.diagnosis.get("names"))
    name = live.job.job_id + (f" ({display})" if display else "")
    assert alert["annotations"]["summary"] == f"Training job {name} is deadlocked"
    description = alert["annotations"]["description"]
    # The culprit is named with the node it runs on, as the monitor's own diagnosis has it.
    (culprit,) = [r for r in live.diagnosis["ranks"] if r["rank"] == 1]
    assert f"Culprits (live, not in the collective the others wait in): rank 1 on {culprit['node']}." in description
    diagnose = f"/diagnose?job={quote_plus(live.job.job_id)}"
    assert alert["annotations"]["diagnose_url"].endswith(diagnose) and diagnose in description
    assert re.search(r"no progress and nothing being sent for (\d+m )?\d+(\.\d+)?s\.", description), description
    assert alert["annotations"]["runbook_url"].endswith("/runbook#deadlock")

    # No other job alert fires for this job: the verdict is a deadlock, nothing else.
    rules = live.prometheus.api("/api/v1/rules", type="alert")
    states = {r["name"]: r["state"] for g in rules["groups"] for r in g["rules"]}
    assert states["HangwatchDeadlock"] == "firing"
    others = [a for a in live.prometheus.api("/api/v1/alerts")["alerts"]
              if a["labels"].get("job_id") == live.job.job_id and a["labels"]["alertname"] != "HangwatchDeadlock"]
    assert not [a for a in others if a["state"] == "firing"], others
    # Every rule loaded and evaluated without error.
    assert all(r["health"] == "ok" for g in rules["groups"] for r in g["rules"]), rules


def test_target_up_and_agent_reporting(live_hang: LiveHang) -> None:
    live = live_hang
    (up,) = live.prometheus.query('up{job="hangwatch"}')
    assert up["value"][1] == "1"
    ages = live.prometheus.query('time() - hangwatch_agent_last_report_timestamp_seconds{job="hangwatch"}')
    assert ages and all(float(s["value"][1]) < 10 for s in ages), ages
    assert not firing(live, "HangwatchAgentSilent")
    assert not firing(live, "HangwatchMonitorDown") and not firing(live, "HangwatchMonitorAbsent")
    # The monitor's own process and build, as every exporter has them.
    (build,) = live.prometheus.query('hangwatch_build_info{job="hangwatch"}')
    assert build["metric"]["version"] and build["metric"]["python_version"] and build["value"][1] == "1"
    (rss,) = live.prometheus.query('process_resident_memory_bytes{job="hangwatch"}')
    assert float(rss["value"][1]) > 10_000_000
    (started,) = live.prometheus.query('process_start_time_seconds{job="hangwatch"}')
    assert float(started["value"][1]) == pytest.approx(psutil.Process(live.monitor.proc.pid).create_time(), abs=2)
    # The training job's identity arrives as job_id (the scrape job keeps `job`).
    verdicts = live.prometheus.query(f'hangwatch_job_verdict{{job_id="{live.job.job_id}", verdict="deadlock"}}')
    assert [s["value"][1] for s in verdicts] == ["1"], verdicts
    assert all(s["metric"]["job"] == "hangwatch" for s in verdicts)


def test_promtool_check_metrics_on_a_real_scrape(live_hang: LiveHang) -> None:
    scrape = httpx.get(live_hang.monitor.url + "/metrics", timeout=5.0)
    assert scrape.status_code == 200
    assert "hangwatch_job_verdict{" in scrape.text and "hangwatch_rank_cpu_seconds_total{" in scrape.text
    assert "\nprocess_cpu_seconds_total " in scrape.text and "\nhangwatch_build_info{" in scrape.text
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=scrape.text, capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), (
        f"promtool check metrics: rc={check.returncode}\n{check.stdout}{check.stderr}")
