"""deploy/kubernetes: the manifests parse and hold what the agent and monitor need.

They are the Helm chart rendered (scripts/render-deploy.py; tests/ops/test_helm_chart.py validates
the chart against the Kubernetes schemas). There is no cluster here: these checks are what a broken
hang detector would lack: hostPID, SYS_PTRACE, the node name, probes on paths the monitor serves,
a volume for SQLite, command lines and config files the daemons' own parsers take.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
import httpx

from monitor.web.cli import build_parser as monitor_parser
from hangwatch_common.settings import given
from monitor.web.settings import Settings

from tests.ops.conftest import LiveHang

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def objects() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"], path
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, f"{key} defined twice"
            out[key] = doc
    return out


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict]:
    return objects()


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_files_and_namespace(k8s: dict) -> None:
    assert {p.name for p in K8S.glob("*.yaml")} == {"agent-daemonset.yaml", "monitor-deployment.yaml",
                                                     "prometheus-rule.yaml", "service-monitor.yaml"}
    assert ("Namespace", "hangwatch") in k8s
    for (kind, _), obj in k8s.items():
        if kind != "Namespace":
            assert obj["metadata"]["namespace"] == "hangwatch", obj["metadata"]


def test_agent_daemonset(k8s: dict) -> None:
    ds = k8s[("DaemonSet", "hangwatch-agent")]
    assert ds["apiVersion"] == "apps/v1"
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["hostPID"] is True
    assert {"operator": "Exists"} in pod["tolerations"]
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    assert "SYS_PTRACE" in sc["capabilities"]["add"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc.get("privileged") is not True and sc["allowPrivilegeEscalation"] is False
    assert sc["appArmorProfile"]["type"] == "Unconfined"
    env = env_of(agent)
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node=$(NODE_NAME)" in agent["args"]
    assert agent["command"] == ["hangwatch-agent"]
    # The monitor URL names the monitor's Service and port.
    (monitor,) = [a.removeprefix("--monitor=") for a in agent["args"] if a.startswith("--monitor=")]
    url = urlsplit(monitor)
    svc = k8s[("Service", "hangwatch-monitor")]
    assert url.hostname == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert url.port == svc["spec"]["ports"][0]["port"]
    # Every $(VAR) in the arguments is defined.
    for arg in agent["args"]:
        if "$(" in arg:
            assert arg.split("$(")[1].split(")")[0] in env, arg


def with_config_file(container: dict, config_map: dict, tmp_path: Path) -> list[str]:
    """The container's arguments, with its config file (the ConfigMap's one key) written under tmp_path."""
    ((key, text),) = config_map["data"].items()
    (tmp_path / key).write_text(text)
    return [arg.replace(f"/etc/hangwatch/config/{key}", str(tmp_path / key)) for arg in container["args"]]


def test_agent_args_parse_with_the_agent_parser(k8s: dict, tmp_path: Path) -> None:
    from agent.cli import parse_config

    ds = k8s[("DaemonSet", "hangwatch-agent")]
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    argv = [a.replace("$(NODE_NAME)", "gpu-node-07") for a in with_config_file(agent, k8s[("ConfigMap", "hangwatch-agent")],
                                                                                tmp_path)]
    config, _ = parse_config(argv, environ={})
    assert config.node == "gpu-node-07" and config.monitors == ("http://hangwatch-monitor.hangwatch.svc:8787",)
    assert config.token_file == "/etc/hangwatch/token/agent" and config.dump_other_users


def test_monitor_deployment_and_service(k8s: dict, tmp_path: Path) -> None:
    dep = k8s[("Deployment", "hangwatch-monitor")]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pod = dep["spec"]["template"]["spec"]
    (mon,) = pod["containers"]
    port = {p["name"]: p["containerPort"] for p in mon["ports"]}
    # The monitor's own parser on its command line and config file.
    flags, typed = given(monitor_parser().parse_args(with_config_file(mon, k8s[("ConfigMap", "hangwatch-monitor")],
                                                                      tmp_path)))
    settings = Settings.load(flags, env={}, option_names=typed)
    assert settings.host == "0.0.0.0" and settings.port == port["http"]
    assert settings.token_file == Path("/etc/hangwatch/tokens/agents")
    probes = {probe: mon[probe]["httpGet"] for probe in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    assert all(p["port"] in ("http", port["http"]) for p in probes.values())
    # SQLite lives on a volume mounted at the state dir: a PVC defined here (or an emptyDir).
    mounts = {m["mountPath"]: m["name"] for m in mon["volumeMounts"]}
    volume = {v["name"]: v for v in pod["volumes"]}[mounts[str(settings.state_dir)]]
    if "persistentVolumeClaim" in volume:
        pvc = k8s[("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])]
        # Room for the capture and snapshot budgets at least (tests/ops/test_helm_chart.py: the sum).
        size = pvc["spec"]["resources"]["requests"]["storage"]
        assert size.endswith("Gi") and int(size[:-2]) * 1024**3 >= settings.capture_max_bytes + settings.snapshot_budget_bytes
    else:
        assert "emptyDir" in volume
    assert pod["securityContext"]["runAsNonRoot"] is True and mon["securityContext"]["readOnlyRootFilesystem"]
    svc = k8s[("Service", "hangwatch-monitor")]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] in ("http", port["http"])


def test_service_monitor_scrapes_the_monitor_service(k8s: dict) -> None:
    """kube-prometheus-stack: the ServiceMonitor finds the Service, on a port it has, as the job the rules select."""
    monitor = k8s[("ServiceMonitor", "hangwatch-monitor")]
    svc = k8s[("Service", "hangwatch-monitor")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]} and endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "hangwatch"} in endpoint["relabelings"]
    rule = k8s[("PrometheusRule", "hangwatch")]
    # The operator's Prometheus selects both by the Helm release label.
    assert rule["metadata"]["labels"]["release"] == monitor["metadata"]["labels"]["release"]
    assert all('job="hangwatch"' in r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])


@pytest.mark.e2e
def test_probe_path_is_served(live_hang: LiveHang, k8s: dict) -> None:
    """The probes' path answers 200 on the real monitor (the shared one, mid-hang)."""
    dep = k8s[("Deployment", "hangwatch-monitor")]
    (mon,) = dep["spec"]["template"]["spec"]["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        r = httpx.get(live_hang.monitor.url + mon[probe]["httpGet"]["path"], timeout=mon[probe].get("timeoutSeconds", 1))
        assert r.status_code == 200, probe
