"""Ops fixtures: one real hang shared by the Prometheus, dashboard and browser tests.

``live_hang`` (package scope: it ends with the last test of tests/ops) starts a real monitor and agent (hangwatch.demo.harness), a real Prometheus
scraping the monitor, and a headless Chromium with the status page open; then a real 2-rank gloo
job (the ``deadlock`` case of hangwatch/demo/cases.py, slowed so it is healthy for a while) runs until
the monitor says DEADLOCK with rank 1 the culprit. The page is opened *before* the job starts and
never reloaded, so the browser test can check that it updated itself from healthy to deadlock.
Every process is recorded in a Reaper and killed at the end, also when a test fails.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hangwatch.demo.cases import demo_cases
from hangwatch.demo.harness import (
    LOOPBACK,
    Job,
    MonitorClient,
    Reaper,
    Service,
    free_port,
    launch_torchrun,
    start_agent,
    start_monitor,
    stop_gently,
)
from tests.ops.promserver import Prometheus, start_prometheus

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Slow steps (0.2 s) and a late stall (step 50): the job is healthy for ~10 s after start-up, long
# enough for the page (polling every 2 s) and Prometheus (1 s scrapes) to see it healthy first.
STALL_STEP = 50
STEP_SLEEP = "0.2"
VERDICT_TIMEOUT = 60.0
# Linked from the status page, never fetched (the browser test checks every request stays on loopback).
GRAFANA_URL = "https://grafana.example.com/d/hangwatch/jobs?var-job={job}"
RUNBOOK_URL = "https://github.com/hangwatch/hangwatch/blob/main/docs/runbook.md"

# Records what the page shows in its "jobs at a glance" bar, every 200 ms, from page load on;
# ``__loaded`` is set once per document: a reload would start the record over.
RECORDER = """
window.__loadedAt = Date.now();
window.__seen = [];
setInterval(() => {
  const bar = document.getElementById("overview");
  const text = bar ? bar.innerText.trim() : "";
  const last = window.__seen.length ? window.__seen[window.__seen.length - 1].text : null;
  if (text !== last) window.__seen.push({ at: Date.now(), text });
}, 200);
"""


def project_version() -> str:
    """The version pyproject.toml gives: what the wheel and the image must say they are."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname
    return url.startswith(("data:", "about:", "blob:")) or host in ("127.0.0.1", "localhost", "::1")


@dataclass
class LiveHang:
    monitor: Service
    agent: Service
    prometheus: Prometheus
    client: MonitorClient
    job: Job
    page: object  # playwright.sync_api.Page
    requests: list[str] = field(default_factory=list)
    navigations: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    healthy_at: float = 0.0
    deadlock_at: float = 0.0
    diagnosis: dict = field(default_factory=dict)

    def context(self) -> str:
        return "\n".join([
            "job log:\n" + self.job.log_tail(10),
            "agent log:\n" + self.agent.log_tail(10),
            "monitor log:\n" + self.monitor.log_tail(10),
            "prometheus log:\n" + self.prometheus.log_tail(10),
        ])


@pytest.fixture(scope="session")
def ops_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ops")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="package")
def ops_reaper() -> Iterator[Reaper]:
    reaper = Reaper()
    try:
        yield reaper
    finally:
        reaper.close()


@pytest.fixture(scope="package")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="package")
def live_hang(ops_reaper: Reaper, ops_dir: Path, browser, artifacts: Path) -> Iterator[LiveHang]:
    # The job's id is fixed in advance so that the agent watches this job only (other tests may
    # run training jobs on this machine at the same time).
    port = free_port()
    job_id = f"{LOOPBACK}:{port}"
    with pytest.MonkeyPatch.context() as env:
        # The page's links (test_status_page.py); start_monitor passes HANGWATCH_* settings on.
        env.setenv("HANGWATCH_GRAFANA_URL", GRAFANA_URL)
        env.setenv("HANGWATCH_RUNBOOK_URL", RUNBOOK_URL)
        monitor = start_monitor(ops_reaper, ops_dir)
    agent = start_agent(ops_reaper, ops_dir, monitor.url, interval=1.0, extra=["--job", job_id])
    prometheus = start_prometheus(ops_reaper, ops_dir / "prometheus", monitor.url)
    client = MonitorClient(monitor.url)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        requests: list[str] = []
        navigations: list[str] = []
        page_errors: list[str] = []

        # Requests are recorded, not intercepted: a route handler only runs while this thread is
        # inside a playwright call, and the page must keep polling while the test waits elsewhere.
        page.on("request", lambda req: requests.append(req.url))
        page.on("framenavigated", lambda f: navigations.append(f.url) if f == page.main_frame else None)
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        page.on("console", lambda msg: page_errors.append(msg.text) if msg.type == "error" else None)
        page.on("response", lambda r: page_errors.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
        page.add_init_script(RECORDER)
        page.goto(monitor.url + "/", wait_until="load")

        case = demo_cases(STALL_STEP)["deadlock"]
        job = launch_torchrun(ops_reaper, ops_dir, [*case.train_args, "--step-sleep", STEP_SLEEP],
                              nproc=case.nranks, port=port, name="deadlock")
        assert job.job_id == job_id
        job.rank_pids(timeout=30)
        live = LiveHang(monitor, agent, prometheus, client, job, page, requests, navigations, page_errors)
        try:
            client.wait_for_verdict(job.job_id, "healthy", VERDICT_TIMEOUT, context=live.context)
            live.healthy_at = time.time()
            # The page must show the healthy job before the stall, without being reloaded.
            page.wait_for_function("(job) => window.__seen.some(s => s.text.includes(job) && /HEALTHY/.test(s.text))",
                                   arg=job.job_id, timeout=20_000)
            page.screenshot(path=str(artifacts / "status-page-healthy.png"), full_page=True)
            live.diagnosis = client.wait_for_verdict(job.job_id, case.expect, VERDICT_TIMEOUT, culprits=case.culprits,
                                                     context=live.context)
        except AssertionError as e:
            pytest.fail(f"the shared hang did not happen: {e}", pytrace=False)
        live.deadlock_at = time.time()
        yield live
    finally:
        client.close()
        context.close()
        stop_gently(agent.proc)
        stop_gently(monitor.proc)
        stop_gently(prometheus.proc)
