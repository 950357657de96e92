"""A real Prometheus scraping a real monitor during a real deadlock: the alert fires via its API."""

from __future__ import annotations

import subprocess
import time

import httpx
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
    assert alert["annotations"]["summary"] == f"Training job {live.job.job_id} is deadlocked"
    description = alert["annotations"]["description"]
    assert "1 culprit rank(s)" in description, description
    assert f"/diagnose?job={live.job.job_id}" in description
    assert alert["annotations"]["runbook_url"].endswith("docs/runbook.md#deadlock")

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
    ages = live.prometheus.query("hangwatch_agent_last_report_age_seconds")
    assert ages and all(float(s["value"][1]) < 10 for s in ages), ages
    assert not firing(live, "HangwatchAgentSilent")
    # The training job's identity arrives as job_id (the scrape job keeps `job`).
    verdicts = live.prometheus.query(f'hangwatch_job_verdict{{job_id="{live.job.job_id}", verdict="deadlock"}}')
    assert [s["value"][1] for s in verdicts] == ["1"], verdicts
    assert all(s["metric"]["job"] == "hangwatch" for s in verdicts)


def test_promtool_check_metrics_on_a_real_scrape(live_hang: LiveHang) -> None:
    scrape = httpx.get(live_hang.monitor.url + "/metrics", timeout=5.0)
    assert scrape.status_code == 200
    assert "hangwatch_job_verdict{" in scrape.text and "hangwatch_rank_cpu_seconds_total{" in scrape.text
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=scrape.text, capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), (
        f"promtool check metrics: rc={check.returncode}\n{check.stdout}{check.stderr}")
