"""A real Prometheus server (Debian's `prometheus`) on a loopback port, for the ops tests.

Its configuration is deploy/prometheus/scrape-config.yml with the target, the rule files and the
intervals replaced; its rules are the mixin's recording rules and dashboards/hangwatch-alerts.yml
with every ``for:`` shortened (``rules_for_test``), so an alert fires within seconds of the verdict
instead of 30 s to 5 min.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from hangwatch.demo.harness import LOOPBACK, Reaper, free_port, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "hangwatch-alerts.yml"
RECORDING_RULES = ROOT / "dashboards" / "hangwatch-rules.yml"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "scrape-config.yml"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
TEST_FOR = "2s"
FOR_LINE = re.compile(r"^(\s+for:\s*)\S+\s*$", re.MULTILINE)


def rules_for_test(text: str, new_for: str = TEST_FOR) -> str:
    """The rule file with every ``for:`` set to ``new_for`` (a text edit: comments and layout kept)."""
    out, n = FOR_LINE.subn(lambda m: m.group(1) + new_for, text)
    assert n == len(re.findall(r"- alert:", text)), "every alert rule should have one `for:`"
    return out


def config_for_test(target: str, rule_files: list[Path]) -> dict:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    assert [Path(f).name for f in config["rule_files"]] == [f.name for f in rule_files]
    config["rule_files"] = [str(f) for f in rule_files]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "hangwatch"]
    job["static_configs"] = [{"targets": [target]}]
    job["scrape_interval"] = "1s"
    job["scrape_timeout"] = "1s"
    return config


@dataclass
class Prometheus:
    proc: subprocess.Popen
    url: str
    log: Path

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def api(self, path: str, **params: str) -> dict:
        r = httpx.get(self.url + path, params=params, timeout=5.0)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("/api/v1/query", query=expr)["result"]


def start_prometheus(reaper: Reaper, workdir: Path, monitor_url: str, timeout: float = 30.0) -> Prometheus:
    workdir.mkdir(parents=True, exist_ok=True)
    rule_file = workdir / RULES.name
    rule_file.write_text(rules_for_test(RULES.read_text()))
    recording_file = workdir / RECORDING_RULES.name
    recording_file.write_text(RECORDING_RULES.read_text())
    config_file = workdir / "prometheus.yml"
    target = monitor_url.split("://", 1)[1]
    config_file.write_text(yaml.safe_dump(config_for_test(target, [rule_file, recording_file])))
    subprocess.run([PROMTOOL, "check", "config", str(config_file)], check=True, capture_output=True, text=True)
    port = free_port()
    log = workdir / "prometheus.log"
    with open(log, "wb") as out:
        proc = reaper.popen([PROMETHEUS, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             f"--web.listen-address={LOOPBACK}:{port}", "--log.level=warn"],
                            stdout=out, stderr=subprocess.STDOUT)
    prom = Prometheus(proc, f"http://{LOOPBACK}:{port}", log)
    wait_until_ready(proc, prom.url + "/-/ready", "prometheus", prom.log_tail, timeout, poll=0.2)
    return prom
