"""The monitoring mixin (dashboards/mixin/): one jsonnet source, its checked-in outputs up to date (the
Helm chart's copies included), and a site's own configuration carried into every rule, annotation and
query (checked by promtool).

Each run of scripts/build-mixin.py evaluates the mixin twice (the site's outputs, the chart's
copies), ~2 s of CPU each. The checked-in outputs and the hand edit are checked against the same
evaluation, of the default configuration: those two tests call the script's ``main`` in this
process, its ``build`` cached for the module (``build_mixin``): one build where there were four.
The site's configuration and the missing jsonnet run the script as a command.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.ops.promserver import PROMTOOL, RECORDING_RULES, RULES

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-mixin.py"
K8S = ROOT / "deploy" / "kubernetes"
CHART_RULES = Path("deploy") / "helm" / "hangwatch" / "files" / "prometheus-rules.yaml"
SITE_CONFIG = """{
  hangwatchSelector: 'job="hw", namespace="ml"',
  clusterLabel: '',
  runbookURLPattern: 'https://wiki.example.org/hangwatch/%s',
  monitorURL: 'https://hangwatch.example.org',
  agentSilentSeconds: 90,
}"""


def build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BUILD), *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def build_mixin() -> ModuleType:
    """scripts/build-mixin.py as a module of its own, its ``build`` evaluating each configuration once:
    the mixin's sources do not change during the tests (only outputs are edited, under tmp_path)."""
    spec = importlib.util.spec_from_file_location("build_mixin", BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build = functools.cache(module.build)
    return module


def test_checked_in_outputs_are_what_the_mixin_builds(build_mixin: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """Nobody edits the YAML or the dashboard by hand: change dashboards/mixin/ and rebuild."""
    assert build_mixin.main(["--check"]) == 0, capsys.readouterr().err


def test_check_catches_a_hand_edit(build_mixin: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build_mixin.main(["--out", str(tmp_path)]) == 0
    assert build_mixin.main(["--check", "--out", str(tmp_path)]) == 0, capsys.readouterr().err
    alerts = tmp_path / "dashboards" / "hangwatch-alerts.yml"
    alerts.write_text(alerts.read_text().replace("for: 30s", "for: 10s"))
    assert build_mixin.main(["--check", "--out", str(tmp_path)]) == 1
    assert "dashboards/hangwatch-alerts.yml" in capsys.readouterr().err


def test_without_jsonnet_one_line_and_exit_2() -> None:
    """The quick start's venv has no jsonnet: say where it comes from, not a traceback."""
    hide = ("import runpy, sys; sys.modules['_jsonnet'] = None; sys.argv = ['build-mixin.py', '--check'];"
            f" runpy.run_path({str(BUILD)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "jsonnet" in result.stderr and "scripts/setup.sh" in result.stderr and "pip install jsonnet" in result.stderr


def test_the_runbook_links_follow_the_monitor_by_default() -> None:
    """A site that sets only its monitor's address gets alerts linking to that monitor's own runbook page."""
    import _jsonnet

    snippet = ("(import 'config.libsonnet') + { _config+:: { monitorURL: 'https://hw.example.org' } }"
               "+ { pattern: self._config.runbookURLPattern }")
    config = json.loads(_jsonnet.evaluate_snippet("site", snippet, jpathdir=[str(ROOT / "dashboards" / "mixin")]))
    assert config["pattern"] == "https://hw.example.org/runbook#%s"
    (deadlock,) = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                   if r.get("alert") == "HangwatchDeadlock"]
    monitor = deadlock["annotations"]["diagnose_url"].split("/diagnose?")[0]
    assert deadlock["annotations"]["runbook_url"] == monitor + "/runbook#deadlock"


def test_prometheus_rule_holds_the_same_rules() -> None:
    """deploy/kubernetes/ (the chart as release "hangwatch" in namespace "hangwatch") links to the
    same monitor as the mixin's default: its rules are the rule files exactly."""
    (rule,) = yaml.safe_load_all((K8S / "prometheus-rule.yaml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    files = [yaml.safe_load(f.read_text())["groups"] for f in (RULES, RECORDING_RULES)]
    assert rule["spec"]["groups"] == files[0] + files[1]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_a_site_config_reaches_every_output(tmp_path: Path) -> None:
    config = tmp_path / "site.jsonnet"
    config.write_text(SITE_CONFIG)
    out = tmp_path / "out"
    result = build("--config", str(config), "--out", str(out))
    assert result.returncode == 0, result.stderr
    alerts_file, rules_file = out / "dashboards" / "hangwatch-alerts.yml", out / "dashboards" / "hangwatch-rules.yml"
    check = subprocess.run([PROMTOOL, "check", "rules", str(alerts_file), str(rules_file)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    text = alerts_file.read_text() + rules_file.read_text()
    assert 'job="hangwatch"' not in text and "cluster" not in text
    assert "github.com" not in text and "example.internal" not in text
    rules = [r for g in yaml.safe_load(alerts_file.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        assert 'job="hw", namespace="ml"' in rule["expr"], rule["alert"]
        assert rule["annotations"]["runbook_url"].startswith("https://wiki.example.org/hangwatch/")
    (silent,) = [r for r in rules if r["alert"] == "HangwatchAgentSilent"]
    assert silent["expr"].endswith("> 90")

    dashboard = json.loads((out / "dashboards" / "hangwatch-grafana.json").read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "job"]  # no cluster variable
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    # Every raw series (not a recorded one, whose name holds colons) is read through the site's selector.
    raw = re.findall(r"(?<![\w:])((?:hangwatch|process)_\w+|up)\{([^}]*)\}", exprs)
    assert len(raw) >= 10 and all(m.startswith('job="hw", namespace="ml"') for _, m in raw), raw
    # The chart's copy: the site's selectors, with the markers its templates replace for the links.
    chart_rules = [r for g in yaml.safe_load((out / CHART_RULES).read_text())["groups"] for r in g["rules"]]
    assert [r["expr"] for r in chart_rules] == [r["expr"] for g in yaml.safe_load(alerts_file.read_text())["groups"]
                                                for r in g["rules"]] + [r["expr"] for g in yaml.safe_load(
                                                    rules_file.read_text())["groups"] for r in g["rules"]]
    (deadlock,) = [r for r in chart_rules if r.get("alert") == "HangwatchDeadlock"]
    assert deadlock["annotations"]["diagnose_url"].startswith("__HANGWATCH_MONITOR_URL__/diagnose?job=")
    assert deadlock["annotations"]["runbook_url"] == "__HANGWATCH_RUNBOOK_URL__#deadlock"

    # The templates still render under the site's selector: promtool evaluates the deadlock alert.
    unit = tmp_path / "site.test.yml"
    unit.write_text(yaml.safe_dump({
        "rule_files": [str(alerts_file)],
        "evaluation_interval": "5s",
        "tests": [{
            "interval": "5s",
            "input_series": [
                {"series": 'hangwatch_job_verdict{job="hw", namespace="ml", job_id="slurm:42", verdict="deadlock"}',
                 "values": "1x20"},
                {"series": 'hangwatch_rank_culprit{job="hw", namespace="ml", job_id="slurm:42", rank="3", node="gpu9"}',
                 "values": "1x20"},
                {"series": 'hangwatch_job_last_progress_timestamp_seconds{job="hw", namespace="ml", job_id="slurm:42"}',
                 "values": "0x20"},
                {"series": 'hangwatch_job_info{job="hw", namespace="ml", job_id="slurm:42", display="slurm job 42"}',
                 "values": "1x20"},
                # Outside the site's selector: not this job's name.
                {"series": 'hangwatch_job_info{job="hw", job_id="slurm:42", display="someone else"}', "values": "1x20"},
            ],
            "alert_rule_test": [{
                "eval_time": "1m",
                "alertname": "HangwatchDeadlock",
                "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "job_id": "slurm:42"},
                    "exp_annotations": {
                        "summary": "Training job slurm:42 (slurm job 42) is deadlocked",
                        "description": (
                            "hangwatch sees job slurm:42 (slurm job 42) parked in a collective with no progress and nothing being"
                            " sent for 1m 0s.\n"
                            "Culprits (live, not in the collective the others wait in): rank 3 on gpu9.\n"
                            "Evidence and stacks: https://hangwatch.example.org/diagnose?job=slurm%3A42"),
                        "diagnose_url": "https://hangwatch.example.org/diagnose?job=slurm%3A42",
                        "runbook_url": "https://wiki.example.org/hangwatch/deadlock",
                    },
                }],
            }],
        }],
    }))
    result = subprocess.run([PROMTOOL, "test", "rules", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
