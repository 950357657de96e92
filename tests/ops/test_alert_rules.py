"""The mixin's rule files (dashboards/hangwatch-alerts.yml, hangwatch-rules.yml): promtool's own checks
and unit tests, and the conventions."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from monitor.web.app import create_app
from monitor.diagnosis import VERDICTS
from monitor.diagnosis.verdict_catalogue import QUIET
from monitor.web.settings import Settings
from monitor.storage.store import VerdictChange, open_store
from hangwatch.demo.harness import LOOPBACK, Reaper, free_port, wait_until_ready
from tests.monitor.monitor_reports import progress, rank, report, stack
from tests.monitor.monitor_testkit import FakeClock, TestClient
from tests.monitor.real_monitor import running_monitor
from tests.ops.promserver import PROMTOOL, RECORDING_RULES, RULES, TEST_FOR, rules_for_test, start_prometheus

ROOT = Path(__file__).resolve().parents[2]
RULE_TESTS = sorted((ROOT / "dashboards" / "tests").glob("*.yml"))
RUNBOOK = ROOT / "docs" / "runbook.md"
INHIBIT = ROOT / "deploy" / "prometheus" / "alertmanager-inhibit.yml"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
AMTOOL = "/usr/bin/amtool"
# The runbook page of the monitor that raised the alert (the mixin's default monitorURL), at a section.
RUNBOOK_URL = re.compile(r"^(http://hangwatch-monitor\.hangwatch\.svc:8787)/runbook#([a-z0-9-]+)$")


def alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=ROOT)


def recording_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RECORDING_RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(RULES), str(RECORDING_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout
    assert f"SUCCESS: {len(recording_rules())} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    assert RULE_TESTS, "no rule unit tests in dashboards/tests/"
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_every_alert_and_recording_rule_is_unit_tested() -> None:
    cases = [case for f in RULE_TESTS for case in yaml.safe_load(f.read_text())["tests"]]
    tested = {t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert {a["alert"] for a in alerts()} <= tested
    evaluated = " ".join(t["expr"] for case in cases for t in case.get("promql_expr_test", []) if t.get("exp_samples"))
    untested = {r["record"] for r in recording_rules()} - set(re.findall(r"[\w:]+", evaluated))
    # The per-rank progress age is the per-job one by rank: tested through the same expression shape.
    assert untested <= {"job_id_rank:hangwatch_seconds_since_progress:min"}, untested


def test_each_hang_verdict_has_an_alert() -> None:
    exprs = " ".join(a["expr"] for a in alerts())
    for verdict in set(VERDICTS) - QUIET:
        assert f'verdict="{verdict}"' in exprs, verdict
    assert "hangwatch_agent_last_report_timestamp_seconds" in exprs
    # The monitor itself: down, and not scraped at all.
    assert 'up{job="hangwatch"}' in exprs and 'absent(up{job="hangwatch"})' in exprs


def test_job_alerts_name_culprits_and_link_to_the_monitor() -> None:
    """Each culprit-bearing alert names ranks with their nodes, never just a count."""
    by_name = {a["alert"]: a for a in alerts()}
    for name in ("HangwatchDeadlock", "HangwatchRankExited", "HangwatchRankStopped", "HangwatchStraggler"):
        description = by_name[name]["annotations"]["description"]
        assert "hangwatch_rank_culprit{" in description and "$c.Labels.rank" in description, name
        assert "$c.Labels.node" in description and "hangwatch_job_culprit_ranks" not in description, name
    for a in alerts():
        if 'by (cluster, job_id)' in a["expr"]:
            assert a["annotations"]["diagnose_url"].endswith("/diagnose?job={{ $labels.job_id | urlquery }}")
            assert a["annotations"]["diagnose_url"] in a["annotations"]["description"]
    # Every aggregation keeps the cluster label, so two clusters' jobs never merge into one alert.
    for rule in alerts() + recording_rules():
        for clause in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            assert clause.split(", ")[0] == "cluster", (rule.get("alert") or rule["record"], clause)


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_conventions(alert: dict) -> None:
    assert re.fullmatch(r"Hangwatch[A-Z][A-Za-z]+", alert["alert"])
    assert re.fullmatch(r"\d+[sm]", alert["for"]), "every alert waits a while before firing"
    assert alert["labels"]["severity"] in ("critical", "warning")
    notes = alert["annotations"]
    assert notes["summary"].strip() and notes["description"].strip()
    link = RUNBOOK_URL.match(notes["runbook_url"])
    assert link, notes["runbook_url"]
    monitor, anchor = link.groups()
    if "diagnose_url" in notes:  # the same monitor for the evidence and for what to do
        assert notes["diagnose_url"].startswith(monitor + "/diagnose?"), notes["diagnose_url"]
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^## (.+)$", RUNBOOK.read_text(), re.MULTILINE)}
    assert anchor in headings, f"docs/runbook.md has no section #{anchor}"
    # Templated with the job, the node or the monitor (its own troubles) the alert is about; the
    # absent-monitor alert has only the scrape job it looked for.
    assert any(f"{{{{ $labels.{label} }}}}" in notes["summary"] for label in ("job_id", "node", "instance", "job"))


def test_rules_use_only_metrics_the_monitor_exports(tmp_path: Path) -> None:
    """Every series the rules read is in a real scrape of a monitor with a job and a node."""
    # No shedding: on a loaded machine the app's loop lags, and a 503 here is not what is tested.
    settings = Settings.from_raw({"db": tmp_path / "m.db", "tick_interval_s": 0, "shed_lag_s": 3600})
    store = open_store(settings)
    # An incident in the history that named node-a (hangwatch_node_culprit_jobs is read from it).
    store.add_verdict(VerdictChange("earlier-job", time.time() - 60, "deadlock", (1,), "stuck", ("node-a",)))
    clock = FakeClock(time.time())
    try:
        with TestClient(create_app(settings, store, clock=clock)) as client:
            # Half a minute of steps, a report a second: the job's pace settles (its pace series).
            for second in range(30):
                now = clock()
                body = report(ranks=[rank(rank=0, progress=progress(1 + 5 * second, 10 + 5 * second,
                                                                    [(now, 10 + 5 * second)]),
                                          stack=stack(now)), rank(rank=1)],
                              collectors=[{"name": "stacks", "ok": True}], sent_at=now)
                assert client.post("/api/v1/reports", json=body).status_code == 202
                clock.advance(1.0)
            scrape = client.get("/metrics").text
    finally:
        store.close()
    exported = {s.name for f in text_string_to_metric_families(scrape) for s in f.samples}
    used = set(re.findall(r"(?<![\w:])(?:hangwatch|process)_\w+", RULES.read_text() + RECORDING_RULES.read_text()))
    assert used <= exported, used - exported


def test_the_integration_copy_only_shortens_for(tmp_path: Path) -> None:
    """tests/ops/test_prometheus.py loads the rules with every `for:` set to TEST_FOR."""
    short = rules_for_test(RULES.read_text())
    copy = tmp_path / "rules.yml"
    copy.write_text(short)
    assert promtool("check", "rules", str(copy)).returncode == 0
    original, changed = alerts(), [r for g in yaml.safe_load(short)["groups"] for r in g["rules"]]
    assert [r["for"] for r in changed] == [TEST_FOR] * len(original)
    for a, b in zip(original, changed):
        assert {**a, "for": TEST_FOR} == b


def test_alertmanager_inhibit_example_is_valid() -> None:
    result = subprocess.run([AMTOOL, "check-config", str(INHIBIT)], capture_output=True, text=True)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    assert " - 1 inhibit rules" in result.stdout, result.stdout
    # It names the rules' own alerts: a renamed alert would leave it muting nothing.
    names = {a["alert"] for a in alerts()}
    (rule,) = yaml.safe_load(INHIBIT.read_text())["inhibit_rules"]
    sources = re.fullmatch(r'alertname=~"(.+)"', rule["source_matchers"][0]).group(1).split("|")
    assert set(sources) == {"HangwatchMonitorDown", "HangwatchMonitorAbsent"} <= names


def test_monitor_down_inhibits_that_clusters_other_alerts(tmp_path: Path) -> None:
    """A real Alertmanager with the example file: HangwatchMonitorDown in cluster c1 mutes c1's job
    and agent alerts, not c2's, and not itself."""
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    log = tmp_path / "alertmanager.log"
    with log.open("w") as out:
        proc = subprocess.Popen([ALERTMANAGER, f"--config.file={INHIBIT}", f"--storage.path={tmp_path / 'data'}",
                                 f"--web.listen-address={LOOPBACK}:{port}", "--cluster.listen-address="],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(proc, url + "/-/ready", "alertmanager", lambda: log.read_text(errors="replace"), 20.0)
        sent = {
            "down c1": {"alertname": "HangwatchMonitorDown", "cluster": "c1", "instance": "mon:8787"},
            "deadlock c1": {"alertname": "HangwatchDeadlock", "cluster": "c1", "job_id": "j"},
            "agent c1": {"alertname": "HangwatchAgentSilent", "cluster": "c1", "node": "n1"},
            "deadlock c2": {"alertname": "HangwatchDeadlock", "cluster": "c2", "job_id": "j"},
            "other c1": {"alertname": "NodeDown", "cluster": "c1", "instance": "n1"},
        }
        r = httpx.post(url + "/api/v2/alerts", json=[{"labels": labels} for labels in sent.values()], timeout=5.0)
        assert r.status_code == 200, r.text
        want = {"down c1": False, "deadlock c1": True, "agent c1": True, "deadlock c2": False, "other c1": False}
        end = time.monotonic() + 15
        while True:
            got = {name: None for name in sent}
            for a in httpx.get(url + "/api/v2/alerts", timeout=5.0).json():
                (name,) = [n for n, labels in sent.items() if labels == a["labels"]]
                got[name] = bool(a["status"]["inhibitedBy"])
            if got == want or time.monotonic() > end:
                break
            time.sleep(0.2)
        assert got == want, f"{got}\n{log.read_text(errors='replace')}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_real_prometheus_scrapes_gzip_and_sees_a_monitor_at_capacity(tmp_path: Path) -> None:
    """A real monitor that may follow one job, scraped by a real Prometheus (which asks for gzip)
    with the mixin's rules (`for:` shortened): a second job's agent is refused (too_many_jobs) for
    as long as it reports, and HangwatchReportsRefusedAtCapacity fires naming the reason and the count."""
    with Reaper() as reaper, running_monitor(tmp_path, extra_env={"HANGWATCH_MAX_JOBS": "1"}) as monitor:
        reports = monitor.base + "/api/v1/reports"
        watched = report(node="node-a", ranks=[rank(job_id="watched", rank=r) for r in (0, 1)])
        assert httpx.post(reports, json=watched, timeout=10).status_code == 202
        prometheus = start_prometheus(reaper, tmp_path / "prometheus", monitor.base)
        unwatched = report(node="node-b", ranks=[rank(job_id="unwatched", rank=r) for r in (0, 1)])
        deadline = time.monotonic() + 60
        fired: list[dict] = []
        while not fired and time.monotonic() < deadline:
            assert httpx.post(reports, json=unwatched, timeout=10).status_code == 429  # the agent retries
            fired = [a for a in prometheus.api("/api/v1/alerts")["alerts"]
                     if a["labels"]["alertname"] == "HangwatchReportsRefusedAtCapacity" and a["state"] == "firing"]
            time.sleep(0.5)
        assert fired, f"no capacity alert within 60 s\n{prometheus.log_tail()}\n{monitor.log_text()}"
        (alert,) = fired
        assert alert["labels"]["reason"] == "too_many_jobs" and alert["labels"]["severity"] == "warning"
        assert "it already follows 1 jobs, the most HANGWATCH_MAX_JOBS allows." in alert["annotations"]["description"]
        # The gzipped scrape arrived whole: the watched job's ranks, each with its node.
        alive = prometheus.query('hangwatch_rank_alive{job="hangwatch"}')
        assert {(s["metric"]["job_id"], s["metric"]["rank"], s["metric"]["node"]) for s in alive} == {
            ("watched", "0", "node-a"), ("watched", "1", "node-a")}
        (up,) = prometheus.query('up{job="hangwatch"}')
        assert up["value"][1] == "1"
