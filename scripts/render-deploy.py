#!/usr/bin/env python3
"""Write what the Helm chart (deploy/helm/hangwatch) takes from the code, and the raw manifests
(deploy/kubernetes/) rendered from the chart.

    .venv/bin/python scripts/render-deploy.py            # rewrite them
    .venv/bin/python scripts/render-deploy.py --check    # exit 1 if any differs (tests/ops/test_helm_chart.py)

From the daemons' settings declarations (agent/settings.py, monitor/web/settings.py, monitor/relay/cli.py
and the parts they are made of): every setting, with its default and help, in values.yaml under
monitor.config, agent.config and relay.config; values.schema.json, which makes helm refuse an unknown
setting or a value of the wrong kind before anything is installed; and files/declared-settings.json,
from which the templates take the defaults (the state volume is sized from the monitor's budgets) and
the settings the chart sets itself. Chart.yaml's version and appVersion are the project's
(pyproject.toml). Then deploy/kubernetes/ is the chart rendered by Helm's own engine (the helm-python-sdk
package, Helm's Go SDK as a library) with RAW_VALUES: the same objects, so the two cannot drift.
Never edit the outputs by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.settings import AgentSettings  # noqa: E402
from hangwatch_common.settings import Declared, declared  # noqa: E402
from monitor.relay.cli import RelaySettings  # noqa: E402
from monitor.web.settings import Settings  # noqa: E402

CHART = ROOT / "deploy" / "helm" / "hangwatch"
RAW = ROOT / "deploy" / "kubernetes"
DAEMONS = {"monitor": Settings, "agent": AgentSettings, "relay": RelaySettings}
# Settings the chart gives as flags (which win over the config file), and what decides each.
SET_BY_CHART = {
    "monitor": {"config": "its config file", "host": "0.0.0.0", "port": "monitor.port",
                "state_dir": "the state volume", "token_file": "tokens.enabled", "read_token_file": "tokens.read",
                "metrics_token_file": "tokens.metrics", "relay_token_file": "relay.enabled with tokens.enabled",
                "ssl_certfile": "monitor.tls.secretName", "ssl_keyfile": "monitor.tls.secretName"},
    "agent": {"config": "its config file", "monitor": "the monitor's Service, or the relays' with relay.enabled",
              "node": "the Kubernetes node's name", "token_file": "tokens.enabled",
              "ca_file": "monitor.tls.privateCA", "dump_other_users": "agent.dumpOtherUsers"},
    "relay": {"config": "its config file", "monitor": "the monitor's Service", "host": "0.0.0.0",
              "port": "relay.port", "token_file": "tokens.enabled", "relay_token_file": "tokens.enabled",
              "metrics_token_file": "tokens.metrics", "ca_file": "monitor.tls.privateCA"},
}
# Monitor settings whose default the chart takes from a value of its own (templates/monitor-config.yaml).
CHART_DEFAULTS = {"monitor": {"runbook_url": "runbookURL", "grafana_url": "grafanaURL"}}
# What the monitor keeps on its state volume, at most: the volume's default size adds these up.
STATE_BUDGETS = ("capture_max_bytes", "snapshot_budget_bytes", "min_free_bytes")

# deploy/kubernetes/: the chart as release "hangwatch" in namespace "hangwatch", with a Namespace
# object, the tokens from a Secret the user makes (never random ones in a checked-in file), and the
# kube-prometheus-stack objects in files of their own.
RELEASE = "hangwatch"
RAW_VALUES = {"createNamespace": True, "tokens": {"existingSecret": "hangwatch-tokens"},
              "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
RAW_FILES = {
    "monitor-deployment.yaml": ("namespace.yaml", "monitor-config.yaml", "monitor-pvc.yaml",
                                "monitor-deployment.yaml", "monitor-service.yaml"),
    "agent-daemonset.yaml": ("agent-config.yaml", "agent-daemonset.yaml"),
    "prometheus-rule.yaml": ("prometheus-rule.yaml",),
    "service-monitor.yaml": ("service-monitor.yaml",),
}
RAW_HEADER = """\
# Rendered by scripts/render-deploy.py from the Helm chart deploy/helm/hangwatch (release "hangwatch",
# namespace "hangwatch") -- edit the chart, not this file. The chart is the way to set values
# (docs/install.md); these are its defaults.
"""
# How to apply them, at the top of the first file.
RAW_FIRST_STEPS = """\
# The tokens come from a Secret you make first (the pods wait for it):
#   umask 077; python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > agent; cp agent agents
#   kubectl apply -f deploy/kubernetes/monitor-deployment.yaml    # the namespace first
#   kubectl -n hangwatch create secret generic hangwatch-tokens --from-file=agents --from-file=agent
#   kubectl apply -f deploy/kubernetes/agent-daemonset.yaml
#   [kube-prometheus-stack: kubectl apply -f deploy/kubernetes/service-monitor.yaml -f deploy/kubernetes/prometheus-rule.yaml]
# The image is what `podman build -t hangwatch:0.1.0 .` (or docker build) makes from the repository;
# on a real cluster push it to your registry and point the pods at it:
#   kubectl -n hangwatch set image deployment/hangwatch-monitor monitor=REGISTRY/hangwatch:0.1.0 tokens=REGISTRY/hangwatch:0.1.0
#   kubectl -n hangwatch set image daemonset/hangwatch-agent agent=REGISTRY/hangwatch:0.1.0
"""

BEGIN = re.compile(r"^(?P<indent> *)# BEGIN (?P<daemon>\w+) settings: .*$", re.MULTILINE)
HELP_WIDTH = 100


def _json_default(item: Declared) -> Any:
    """The default as the config file would spell it, or None where it has no fixed value."""
    if item.field.default_factory is not dataclasses.MISSING:
        return None  # worked out at start (the database's path from the state directory)
    value = item.default
    if value is None or value == "":
        return None
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, tuple):
        return [str(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _settings_lines(daemon: str, indent: str) -> list[str]:
    """values.yaml's block of one daemon's settings: ``config: {}`` and every setting, commented."""
    owned, chart_defaults = SET_BY_CHART[daemon], CHART_DEFAULTS.get(daemon, {})
    width = HELP_WIDTH - len(indent) - 4
    items = declared(DAEMONS[daemon])
    set_here = "; ".join(f"{item.name} ({owned[item.name]})" for item in items if item.name in owned)
    lines = [f"{indent}# BEGIN {daemon} settings: written by scripts/render-deploy.py from the declarations; edit those",
             f"{indent}config: {{}}",
             f"{indent}  # Every setting of hangwatch-{daemon}, at its default. To set some, replace {{}} with them:",
             f"{indent}  #   config:",
             f"{indent}  #     log_format: json",
             *(f"{indent}  # {text}" for text in textwrap.wrap(f"Set by the chart, as flags: {set_here}.", width))]
    for item in items:
        if item.name in owned:
            continue
        described = item.described + (f"; default here: the chart's {chart_defaults[item.name]}"
                                      if item.name in chart_defaults else "")
        lines += [f"{indent}  #", *(f"{indent}  # {text}" for text in textwrap.wrap(described, width))]
        default = _json_default(item)
        if default is None:
            lines.append(f"{indent}  # {item.name}:    # default: {item.shown_default}")
            continue
        if isinstance(default, float) and default.is_integer():
            default = int(default)  # as people write it; the daemon reads 15 and 15.0 alike
        # The default in words where it says more than the number (8388608: 8 MiB, 604800: 7 days).
        unit = re.fullmatch(r"\S+ \((.+)\)", item.shown_default)
        lines.append(f"{indent}  # {item.name}: {json.dumps(default)}" + (f"    # {unit.group(1)}" if unit else ""))
    lines.append(f"{indent}# END {daemon} settings")
    return lines


def values_yaml(text: str) -> str:
    """values.yaml with each daemon's settings block written anew (the rest is the chart's own)."""
    out: list[str] = []
    lines = iter(text.splitlines())
    seen = set()
    for line in lines:
        begin = BEGIN.match(line)
        if not begin:
            out.append(line)
            continue
        daemon, indent = begin.group("daemon"), begin.group("indent")
        if daemon not in DAEMONS or daemon in seen:
            raise SystemExit(f"values.yaml: unexpected settings block {daemon!r}")
        seen.add(daemon)
        for rest in lines:
            if rest.strip() == f"# END {daemon} settings":
                break
        else:
            raise SystemExit(f"values.yaml: the {daemon} settings block has no END line")
        out += _settings_lines(daemon, indent)
    if seen != set(DAEMONS):
        raise SystemExit(f"values.yaml: no settings block for {', '.join(sorted(set(DAEMONS) - seen))}")
    return "\n".join(out) + "\n"


def _check_declarations() -> None:
    for daemon, cls in DAEMONS.items():
        names = {item.name for item in declared(cls)}
        for name in [*SET_BY_CHART[daemon], *CHART_DEFAULTS.get(daemon, {}), *(STATE_BUDGETS if daemon == "monitor" else ())]:
            if name not in names:
                raise SystemExit(f"render-deploy.py: hangwatch-{daemon} declares no setting {name!r} any more: "
                                 "update SET_BY_CHART, CHART_DEFAULTS or STATE_BUDGETS and the chart's templates")


def declared_settings_json() -> str:
    """files/declared-settings.json: what the templates read of the declarations."""
    document = {}
    for daemon, cls in DAEMONS.items():
        defaults = {item.name: _json_default(item) for item in declared(cls)}
        document[daemon] = {
            "defaults": {name: value for name, value in defaults.items() if value is not None},
            "setByChart": SET_BY_CHART[daemon],
            "stateBudgets": list(STATE_BUDGETS) if daemon == "monitor" else [],
        }
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def _setting_schema(item: Declared, owned: dict[str, str]) -> dict[str, Any]:
    if item.name in owned:
        # Any kind: the template refuses it, naming the value that sets it (a clearer line than the schema's).
        return {"description": f"set by the chart ({owned[item.name]})"}
    kind = item.kind
    schema: dict[str, Any] = {"type": "boolean" if kind is bool else "integer" if kind is int
                              else "number" if kind is float else "string"}
    if item.spec.choices:
        schema["enum"] = list(item.spec.choices)
    if item.spec.at_least is not None:
        schema["minimum"] = item.spec.at_least
    if item.spec.at_most is not None:
        schema["maximum"] = item.spec.at_most
    if item.spec.positive:
        schema["exclusiveMinimum"] = 0
    if item.repeated:
        schema = {"type": "array", "items": schema}
    return {**schema, "description": item.described}


def _config_schema(daemon: str) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False,
            "description": f"hangwatch-{daemon}'s settings, by name (hangwatch-{daemon} --help)",
            "properties": {item.name: _setting_schema(item, SET_BY_CHART[daemon]) for item in declared(DAEMONS[daemon])}}


def values_schema() -> str:
    """values.schema.json: the settings exactly, and the chart's own values that a typo would break."""
    port = {"type": "integer", "minimum": 1, "maximum": 65535}
    address = {"type": "string", "pattern": "^(https?://.+)?$"}
    enabled = {"type": "object", "properties": {"enabled": {"type": "boolean"}}}
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "hangwatch chart values (written by scripts/render-deploy.py)",
        "type": "object",
        "properties": {
            "image": {"type": "object", "properties": {
                "repository": {"type": "string", "minLength": 1}, "tag": {"type": "string"},
                "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}}},
            "monitorURL": address,
            "runbookURL": address,  # "": the monitor's own /runbook
            "grafanaURL": address,
            "tokens": {"type": "object", "properties": {
                "enabled": {"type": "boolean"}, "read": {"type": "boolean"}, "metrics": {"type": "boolean"},
                "existingSecret": {"type": "string"}}},
            "monitor": {"type": "object", "properties": {
                "port": port,
                "persistence": {"type": "object", "properties": {
                    "enabled": {"type": "boolean"},
                    "size": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?([KMGTPE]i?)?)?$"},
                    "databaseHeadroomBytes": {"type": "integer", "minimum": 0}}},
                "config": _config_schema("monitor")}},
            "agent": {"type": "object", "properties": {
                "tcpInfo": {"type": "boolean"}, "dumpOtherUsers": {"type": "boolean"},
                "config": _config_schema("agent")}},
            "relay": {"type": "object", "properties": {
                "enabled": {"type": "boolean"}, "replicas": {"type": "integer", "minimum": 1}, "port": port,
                "config": _config_schema("relay")}},
            "serviceMonitor": enabled,
            "prometheusRule": enabled,
            "grafanaDashboard": enabled,
        },
    }
    return json.dumps(schema, indent=2) + "\n"


def chart_yaml(text: str) -> str:
    """Chart.yaml with the project's version as the chart's version and appVersion."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    text = re.sub(r"^version: .*$", f"version: {version}", text, count=1, flags=re.MULTILINE)
    return re.sub(r"^appVersion: .*$", f'appVersion: "{version}"', text, count=1, flags=re.MULTILINE)


def render_chart(values: dict[str, Any], chart: Path = CHART, release: str = RELEASE,
                 namespace: str = RELEASE) -> dict[str, str]:
    """template file name -> what Helm's engine renders of it (empty ones left out)."""
    try:
        import helm_python
    except ImportError:
        print("render-deploy.py: error: no helm_python module in this Python; it comes with the test set-up "
              "(scripts/setup.sh, or: .venv/bin/pip install helm-python-sdk)", file=sys.stderr)
        raise SystemExit(2) from None
    rendered = helm_python.Chart.load(str(chart)).render(values, name=release, namespace=namespace, is_install=True)
    prefix = f"{chart.name}/templates/"
    return {path.removeprefix(prefix): text for path, text in rendered.items() if text.strip()}


def raw_manifests(chart: Path = CHART) -> dict[str, str]:
    """deploy/kubernetes/'s files from the chart."""
    rendered = render_chart(RAW_VALUES, chart)
    placed = {t for templates in RAW_FILES.values() for t in templates}
    unplaced = set(rendered) - placed - {"NOTES.txt"}
    if unplaced:
        raise SystemExit(f"render-deploy.py: RAW_FILES does not place {', '.join(sorted(unplaced))}")
    files = {}
    for name, templates in RAW_FILES.items():
        documents = [rendered[t].strip("\n") + "\n" for t in templates if t in rendered]
        header = RAW_HEADER + (RAW_FIRST_STEPS if name == next(iter(RAW_FILES)) else "")
        files[name] = header + "---\n" + "---\n".join(documents)
    return files


def outputs() -> dict[Path, str]:
    """Every written file and its text; the chart's files first, since the manifests are made from them."""
    _check_declarations()
    return {
        CHART / "Chart.yaml": chart_yaml((CHART / "Chart.yaml").read_text()),
        CHART / "values.yaml": values_yaml((CHART / "values.yaml").read_text()),
        CHART / "values.schema.json": values_schema(),
        CHART / "files" / "declared-settings.json": declared_settings_json(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if an output is out of date")
    args = parser.parse_args(argv)
    stale = []

    def settle(path: Path, text: str) -> None:
        if path.exists() and path.read_text() == text:
            return
        stale.append(str(path.relative_to(ROOT)))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    for path, text in outputs().items():
        settle(path, text)
    if args.check and stale:
        # The manifests come from the chart as it should be: not worth rendering from a stale one.
        print(f"out of date: {', '.join(stale)}; run scripts/render-deploy.py", file=sys.stderr)
        return 1
    for name, text in raw_manifests().items():
        settle(RAW / name, text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run scripts/render-deploy.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
