"""The Helm chart (deploy/helm/hangwatch), rendered by Helm's own engine (the helm-python-sdk package:
Helm's Go SDK as a library; no cluster, no helm binary) with its default values and with everything on,
and every object checked against the Kubernetes API's schemas (kubernetes-validate, strict: an unknown
field fails) and, for the ServiceMonitor and PrometheusRule, against the prometheus-operator's CRD
schemas (the cloudcoil models generated from them). The settings files it writes are read by the
daemons' own parsers, its rules by promtool; deploy/kubernetes/ is its render; values.yaml lists
every declared setting.

Not exercised here: a real API server's admission (defaulting, the CRDs installed, quotas) and
pods actually running; tests/ops/test_container.py runs the image itself.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from agent.cli import parse_config
from agent.settings import AgentSettings
from hangwatch_common.settings import declared, given
from monitor.relay.cli import RelaySettings, load_settings as relay_settings
from monitor.web.cli import build_parser as monitor_parser
from monitor.web.settings import Settings
from tests.ops.promserver import PROMTOOL, RECORDING_RULES, RULES

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hangwatch"
RAW = ROOT / "deploy" / "kubernetes"
SCRIPT = ROOT / "scripts" / "render-deploy.py"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the validator knows.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
GiB = 1024**3

_spec = importlib.util.spec_from_file_location("render_deploy", SCRIPT)
render_deploy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_deploy)

EVERYTHING_ON = {
    "monitorURL": "https://hangwatch.example.org",
    "grafanaURL": "https://grafana.example.org/d/hangwatch?var-job={job}",
    "tokens": {"read": True, "metrics": True},
    "monitor": {"tls": {"secretName": "hangwatch-tls", "privateCA": True},
                "config": {"max_jobs": 5000, "capture_max_bytes": 10 * GiB, "log_format": "json", "shed_lag_s": 0.25}},
    "agent": {"tcpInfo": True, "config": {"interval": 2, "log": ["/var/log/train.log"], "log_level": "debug"}},
    "relay": {"enabled": True, "replicas": 3, "config": {"flush_ms": 20}},
    "serviceMonitor": {"enabled": True, "clusterName": "gpu-east"},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
}
WITHOUT_TOKENS_OR_VOLUME = {"tokens": {"enabled": False}, "monitor": {"persistence": {"enabled": False}}}
CASES = {"defaults": {}, "everything on": EVERYTHING_ON, "no tokens, no volume": WITHOUT_TOKENS_OR_VOLUME}


def render(values: dict, release: str = "hangwatch", namespace: str = "hangwatch") -> list[dict]:
    rendered = render_deploy.render_chart(values, release=release, namespace=namespace)
    return [doc for name, text in sorted(rendered.items()) if name != "NOTES.txt"
            for doc in yaml.safe_load_all(text) if doc]


def by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {case: render(values) for case, values in CASES.items()}


@pytest.fixture(scope="module")
def operator_models():
    # Imported once: the generated models are a 2 MB module (~2 s of CPU making its pydantic
    # classes). Its package's __init__ would also import v1alpha1, another 2 s of classes for kinds
    # the chart has none of (AlertmanagerConfig, ScrapeConfig, ...): v1 is loaded on its own, under
    # its own name (pydantic resolves the models' annotations through sys.modules).
    name = "cloudcoil.models.prometheus_operator.v1"
    v1 = sys.modules.get(name)
    if v1 is None:
        (models_dir,) = importlib.util.find_spec("cloudcoil.models").submodule_search_locations
        spec = importlib.util.spec_from_file_location(name, Path(models_dir) / "prometheus_operator" / "v1.py")
        v1 = importlib.util.module_from_spec(spec)
        sys.modules[name] = v1
        spec.loader.exec_module(v1)
    return {"ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}


def _unknown_fields(given_obj: object, checked: object, path: str = "") -> list[str]:
    """Fields of ``given_obj`` that the model dropped (pydantic ignores what its schema lacks)."""
    if isinstance(given_obj, dict):
        missing = [f"{path}.{k}" for k in given_obj if not isinstance(checked, dict) or k not in checked]
        return missing + [m for k, v in given_obj.items() if isinstance(checked, dict) and k in checked
                          for m in _unknown_fields(v, checked[k], f"{path}.{k}")]
    if isinstance(given_obj, list) and isinstance(checked, list):
        return [m for i, (a, b) in enumerate(zip(given_obj, checked)) for m in _unknown_fields(a, b, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("case", CASES)
def test_every_object_is_valid_kubernetes(case: str, rendered: dict, operator_models: dict) -> None:
    objects = rendered[case]
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "DaemonSet", "Service", "ConfigMap"} <= kinds, kinds
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in operator_models:
            model = operator_models[obj["kind"]].model_validate(obj)
            checked = model.model_dump(by_alias=True, exclude_none=True, mode="json")
            assert not _unknown_fields(obj, checked), (name, _unknown_fields(obj, checked))
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{case}: {name} is not valid Kubernetes {version}: {exc.message} at {list(exc.path)}")


def test_the_validators_are_not_vacuous(operator_models: dict) -> None:
    """A misspelt field fails both checks (strict schemas; fields the operator's model drops)."""
    objects = by_kind(render({"serviceMonitor": {"enabled": True}}))
    deployment = objects[("Deployment", "hangwatch-monitor")]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)
    monitor = objects[("ServiceMonitor", "hangwatch-monitor")]
    monitor["spec"]["endpoints"][0]["intervall"] = "5s"
    checked = operator_models["ServiceMonitor"].model_validate(monitor).model_dump(by_alias=True, exclude_none=True)
    assert _unknown_fields(monitor, checked) == [".spec.endpoints[0].intervall"]


def test_helm_lint_finds_nothing() -> None:
    for values in CASES.values():
        report = helm_python.lint(str(CHART), values, strict=True)
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, problems


def test_raw_manifests_are_the_chart_rendered() -> None:
    """deploy/kubernetes/ is what scripts/render-deploy.py renders from the chart, byte for byte."""
    expected = render_deploy.raw_manifests()
    assert {p.name for p in RAW.glob("*.yaml")} == set(expected)
    for name, text in expected.items():
        assert (RAW / name).read_text() == text, f"deploy/kubernetes/{name} differs: run scripts/render-deploy.py"


def test_chart_files_are_up_to_date() -> None:
    """values.yaml's settings, values.schema.json, files/declared-settings.json and Chart.yaml's version."""
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("daemon", "cls"), [("monitor", Settings), ("agent", AgentSettings), ("relay", RelaySettings)])
def test_values_list_every_declared_setting(daemon: str, cls: type) -> None:
    text = (CHART / "values.yaml").read_text()
    block = re.search(rf"# BEGIN {daemon} settings.*?# END {daemon} settings", text, re.DOTALL).group(0)
    listed = set(re.findall(r"^\s*# (\w+):(?: |$)", block, re.MULTILINE))
    prose = " ".join(line.strip().removeprefix("#").strip() for line in block.splitlines())
    set_by_chart = re.search(r"Set by the chart, as flags: (.*?)\.(?: |$)", prose).group(1)
    listed |= set(re.findall(r"(\w+) \(", set_by_chart))
    assert {item.name for item in declared(cls)} <= listed


@pytest.mark.parametrize(("values", "problem"), [
    ({"monitor": {"config": {"max_jobz": 10}}}, "additional properties 'max_jobz' not allowed"),
    ({"monitor": {"config": {"max_jobs": 2.5}}}, "/monitor/config/max_jobs"),
    ({"monitor": {"config": {"log_format": "xml"}}}, "/monitor/config/log_format"),
    ({"agent": {"config": {"interval": 0}}}, "/agent/config/interval"),
    ({"relay": {"enabled": True, "config": {"port": 9000}}}, "relay.config.port is set by the chart (relay.port)"),
    ({"agent": {"config": {"node": "n1"}}}, "agent.config.node is set by the chart"),
    ({"image": {"repository": ""}}, "/image/repository"),
])
def test_values_that_cannot_work_are_refused_at_render(values: dict, problem: str) -> None:
    with pytest.raises(helm_python.HelmError) as info:
        render_deploy.render_chart(values)
    assert problem in str(info.value)


def _container(objects: dict, kind: str, name: str) -> dict:
    (container,) = objects[(kind, name)]["spec"]["template"]["spec"]["containers"]
    return container


def _argv(container: dict, config_map: dict, key: str, tmp_path: Path) -> list[str]:
    """The container's arguments, its config file written where a test can read it."""
    config = tmp_path / key
    config.write_text(config_map["data"][key])
    return [arg.replace(f"/etc/hangwatch/config/{key}", str(config)).replace("$(NODE_NAME)", "gpu-node-07")
            for arg in container["args"]]


def test_the_daemons_read_what_the_chart_sets(tmp_path: Path) -> None:
    """Each daemon's own parser takes the chart's command line and config file: the values reach it."""
    values = {**EVERYTHING_ON, "monitor": {**EVERYTHING_ON["monitor"], "tls": {"secretName": ""}}}
    objects = by_kind(render(values))

    argv = _argv(_container(objects, "Deployment", "hangwatch-monitor"), objects[("ConfigMap", "hangwatch-monitor")],
                 "monitor.toml", tmp_path)
    flags, typed = given(monitor_parser().parse_args(argv))
    monitor = Settings.load(flags, env={}, option_names=typed)
    assert (monitor.host, monitor.port, monitor.state_dir) == ("0.0.0.0", 8787, Path("/var/lib/hangwatch"))
    assert (monitor.max_jobs, monitor.capture_max_bytes, monitor.log_format) == (5000, 10 * GiB, "json")
    assert monitor.shed_lag_s == 0.25 and monitor.grafana_url == EVERYTHING_ON["grafanaURL"]
    # No runbookURL: the page links to the monitor's own /runbook (the alerts to <monitorURL>/runbook).
    assert monitor.runbook_url == "/runbook"
    assert (monitor.token_file, monitor.read_token_file, monitor.metrics_token_file, monitor.relay_token_file) == tuple(
        Path(f"/etc/hangwatch/tokens/{key}") for key in ("agents", "read", "metrics", "relay"))

    argv = _argv(_container(objects, "DaemonSet", "hangwatch-agent"), objects[("ConfigMap", "hangwatch-agent")],
                 "agent.toml", tmp_path)
    agent, _ = parse_config(argv, environ={})
    assert agent.monitors == ("http://hangwatch-relay.hangwatch.svc:8788",) and agent.node == "gpu-node-07"
    assert agent.interval == 2.0 and agent.logs == ("/var/log/train.log",) and agent.dump_other_users

    argv = _argv(_container(objects, "Deployment", "hangwatch-relay"), objects[("ConfigMap", "hangwatch-relay")],
                 "relay.toml", tmp_path)
    relay = relay_settings(argv, env={})
    assert relay.monitor == "http://hangwatch-monitor.hangwatch.svc:8787" and (relay.host, relay.port) == ("0.0.0.0", 8788)
    assert relay.flush_ms == 20 and relay.relay_token_file == "/etc/hangwatch/tokens/relay"
    # Agents post to the relays' Service, which sends them to relay pods on the port they listen on.
    service = objects[("Service", "hangwatch-relay")]
    assert service["spec"]["ports"][0]["port"] == relay.port
    assert service["spec"]["selector"].items() <= objects[("Deployment", "hangwatch-relay")]["spec"]["template"][
        "metadata"]["labels"].items()


def test_state_volume_is_sized_from_the_budgets() -> None:
    defaults = {item.name: item.default for item in declared(Settings)}
    headroom = yaml.safe_load((CHART / "values.yaml").read_text())["monitor"]["persistence"]["databaseHeadroomBytes"]
    budgets = defaults["capture_max_bytes"] + defaults["snapshot_budget_bytes"] + defaults["min_free_bytes"]

    def size(values: dict) -> str:
        return by_kind(render(values))[("PersistentVolumeClaim", "hangwatch-monitor-state")]["spec"]["resources"][
            "requests"]["storage"]

    assert size({}) == f"{math.ceil((budgets + headroom) / GiB)}Gi" == "7Gi"
    bigger = {"monitor": {"config": {"capture_max_bytes": 20 * GiB}}}
    assert size(bigger) == f"{math.ceil((budgets - defaults['capture_max_bytes'] + 20 * GiB + headroom) / GiB)}Gi"
    assert size({"monitor": {"persistence": {"size": "50Gi"}}}) == "50Gi"
    without = by_kind(render(WITHOUT_TOKENS_OR_VOLUME))
    volumes = {v["name"]: v for v in without[("Deployment", "hangwatch-monitor")]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["emptyDir"]["sizeLimit"] == "7Gi"


def test_probes_use_health_and_readiness() -> None:
    monitor = _container(by_kind(render({})), "Deployment", "hangwatch-monitor")
    assert monitor["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert monitor["readinessProbe"]["httpGet"]["path"] == "/readyz"
    tls = _container(by_kind(render(EVERYTHING_ON)), "Deployment", "hangwatch-monitor")
    assert tls["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_tokens_come_from_one_secret_and_never_from_a_value() -> None:
    objects = by_kind(render(EVERYTHING_ON))
    secret = objects[("Secret", "hangwatch-tokens")]
    assert set(secret["data"]) == {"agents", "agent", "read", "metrics", "relay"}
    assert secret["data"]["agents"] == secret["data"]["agent"]
    assert len({secret["data"][k] for k in ("agent", "read", "metrics", "relay")}) == 4
    # A Secret of the user's: the chart makes none, and the pods name it.
    own = by_kind(render({"tokens": {"existingSecret": "mine"}}))
    assert not [key for key in own if key[0] == "Secret"]
    volumes = own[("DaemonSet", "hangwatch-agent")]["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": "mine", "items": [{"key": "agent", "path": "agent"}], "defaultMode": 0o400} in [
        v.get("secret") for v in volumes]
    # No tokens: no Secret, no token flags.
    bare = by_kind(render(WITHOUT_TOKENS_OR_VOLUME))
    assert not [key for key in bare if key[0] == "Secret"]
    assert not [a for a in _container(bare, "DaemonSet", "hangwatch-agent")["args"] if "token" in a]


def test_agent_capabilities() -> None:
    def added(values: dict) -> list[str]:
        return _container(by_kind(render(values)), "DaemonSet", "hangwatch-agent")["securityContext"]["capabilities"]["add"]

    assert added({}) == ["SYS_PTRACE", "DAC_READ_SEARCH", "KILL"]
    assert added({"agent": {"tcpInfo": True}}) == ["SYS_PTRACE", "DAC_READ_SEARCH", "KILL", "SYS_ADMIN"]


def test_rules_link_to_the_release_and_pass_promtool(tmp_path: Path) -> None:
    """The mixin's rules, with this release's monitor and runbook in their links; promtool checks them."""
    values = {"prometheusRule": {"enabled": True}, "runbookURL": "https://wiki.example.org/hangwatch/runbook/",
              "grafanaDashboard": {"enabled": True}}
    objects = by_kind(render(values, release="hw", namespace="ml"))
    rule = objects[("PrometheusRule", "hw-hangwatch")]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    for alert in alerts:
        assert alert["annotations"]["runbook_url"].startswith("https://wiki.example.org/hangwatch/runbook#")
        if "diagnose_url" in alert["annotations"]:
            assert alert["annotations"]["diagnose_url"].startswith("http://hw-hangwatch-monitor.ml.svc:8787/diagnose?job=")
    dashboard = objects[("ConfigMap", "hw-hangwatch-dashboard")]["data"]["hangwatch.json"]
    assert "http://hw-hangwatch-monitor.ml.svc:8787/" in dashboard
    assert "__HANGWATCH_" not in yaml.safe_dump(rule) + dashboard
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_without_a_runbook_url_the_rules_link_to_the_monitors_own_runbook() -> None:
    """runbookURL "" (the default): each alert's runbook is the page of the monitor that raised it."""
    def runbook_urls(values: dict) -> set[str]:
        rule = by_kind(render({"prometheusRule": {"enabled": True}, **values}, release="hw", namespace="ml"))[
            ("PrometheusRule", "hw-hangwatch")]
        return {r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}

    in_cluster = runbook_urls({})
    assert "http://hw-hangwatch-monitor.ml.svc:8787/runbook#deadlock" in in_cluster
    assert all(re.fullmatch(r"http://hw-hangwatch-monitor\.ml\.svc:8787/runbook#[a-z0-9-]+", u) for u in in_cluster)
    outside = runbook_urls({"monitorURL": "https://hangwatch.example.org/"})
    assert "https://hangwatch.example.org/runbook#deadlock" in outside
    assert {u.rsplit("#", 1)[1] for u in outside} == {u.rsplit("#", 1)[1] for u in in_cluster}


def test_default_release_rules_are_the_mixins_files() -> None:
    """Release "hangwatch" in namespace "hangwatch" is what the mixin's default links name: its rules
    are dashboards/hangwatch-alerts.yml and hangwatch-rules.yml exactly."""
    rule = by_kind(render({"prometheusRule": {"enabled": True}}))[("PrometheusRule", "hangwatch")]
    files = [yaml.safe_load(f.read_text())["groups"] for f in (RULES, RECORDING_RULES)]
    assert rule["spec"]["groups"] == files[0] + files[1]


def test_service_monitor_scrapes_as_the_job_the_rules_select() -> None:
    objects = by_kind(render({"serviceMonitor": {"enabled": True, "clusterName": "gpu-east"}}))
    (endpoint,) = objects[("ServiceMonitor", "hangwatch-monitor")]["spec"]["endpoints"]
    job = re.search(r'job="(\w+)"', RULES.read_text()).group(1)
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": job},
                                       {"targetLabel": "cluster", "replacement": "gpu-east"}]
    default = by_kind(render({"serviceMonitor": {"enabled": True}}))[("ServiceMonitor", "hangwatch-monitor")]
    assert default["spec"]["endpoints"][0]["relabelings"] == [{"targetLabel": "job", "replacement": job}]
