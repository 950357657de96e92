"""Builds the monitor's FastAPI app: ``create_app(settings, store)``, no module-level globals."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI

from hangwatch_common.sdnotify import Notifier
from monitor.web import openapi
from monitor.engine.actions.config import load_actions
from monitor.engine.actions.engine import ActionEngine
from monitor.engine.actions.orders import AgentOrders
from monitor.present.answers import AnswerCache
from monitor.engine.capture_requests import CaptureRequests
from monitor.storage.capture_store import CaptureStore
from monitor.web.auth import INGEST, METRICS, READ, RELAY, AuthLayer, TokenFile
from monitor.web.http_guard import HttpStats
from monitor.web.job_series import JobSeries
from monitor.web.load import LoadGuard
from monitor.web.routes import actions, captures, diagnose, health, metrics, nodes, page, summaries
from monitor.web.routes.ingest import IngestLayer
from monitor.web.gc_tuning import GcTamer
from monitor.web.heap_trim import HeapTrimmer
from monitor.web.security_headers import SecurityHeaders
from monitor.engine.service import Monitor
from monitor.web.settings import Settings
from monitor.storage.store import Store

log = logging.getLogger("hangwatch.monitor")
# The most of the event loop's time the background diagnosis passes may take.
PASS_SHARE = 0.4
# How often decided actions are picked up (they follow verdicts that held for seconds at least).
ACTIONS_POLL_S = 0.25


def create_app(settings: Settings, store: Store, clock: Callable[[], float] = time.time) -> FastAPI:
    """The app over an open ``store``; the caller owns the store and closes it after the app stops.

    State is rebuilt from the store's recent reports here, so a restarted monitor keeps its picture.
    """
    orders = AgentOrders()
    action_engine = None
    if settings.actions_file is not None:
        config = load_actions(settings.actions_file)
        action_engine = ActionEngine(config, store, orders, clock=clock)
        log.warning("actions on verdicts are on (%s): %d rules%s", settings.actions_file, len(config.rules),
                    ", dry run: nothing runs, every decision is logged" if config.dry_run else "")
    capture_requests = None
    if settings.capture_after_s > 0:
        capture_store = CaptureStore(settings.capture_dir or settings.db.parent / "captures",
                                     max_total_bytes=settings.capture_max_bytes,
                                     retention_s=settings.capture_retention_s, clock=clock,
                                     min_free_bytes=settings.min_free_bytes)
        capture_requests = CaptureRequests(capture_store, orders, settings.capture_after_s)
    # A watched giant job's answer is rendered as its diagnosis is published (monitor/present/answers.py).
    answers = AnswerCache(clock=clock)
    guard = LoadGuard(shed_lag_s=settings.shed_lag_s, shed_keep_s=settings.shed_keep_s)
    monitor = Monitor(store, settings, clock=clock, orders=orders, actions=action_engine, captures=capture_requests,
                      after_giant_diagnosis=answers.render_ahead, overloaded=lambda: guard.overloaded)
    replayed = monitor.replay()
    if replayed:
        log.info("replayed %d stored reports", replayed)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(guard.watch_loop())]
        gc_was_enabled = gc.isenabled()  # the passes turn automatic collection off (monitor/web/gc_tuning.py)
        if settings.tick_interval_s > 0:
            tasks.append(asyncio.create_task(_tick_forever(monitor, guard, settings.tick_interval_s)))
        if monitor.actions is not None:
            tasks.append(asyncio.create_task(_act_forever(monitor.actions)))
        notifier = Notifier.from_env()
        if notifier.enabled:
            tasks.append(asyncio.create_task(_keep_watchdog_fed(notifier, monitor)))
            notifier.ready(f"serving; {len(monitor.job_ids())} jobs replayed")
        try:
            yield
        finally:
            notifier.stopping()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            notifier.close()
            if gc_was_enabled:
                gc.enable()  # an embedding process (a test) gets its collector back

    app = FastAPI(title="hangwatch monitor", lifespan=lifespan, docs_url=None, redoc_url=None)
    openapi.install(app)  # FastAPI's schema plus the ingest path it cannot see
    app.state.settings = settings
    app.state.monitor = monitor
    app.state.load_guard = guard
    app.state.answers = answers
    app.state.http_stats = http_stats = HttpStats()
    app.state.job_series = JobSeries()  # each job's /metrics text, kept while its published result stands
    # Reports are answered by a plain ASGI layer in front of the app (routes/ingest.py).
    app.add_middleware(IngestLayer, monitor=monitor, settings=settings, guard=guard)
    # Around everything below it: nothing runs for a request whose token is missing or wrong.
    token_files = _token_files(settings)
    if token_files:
        def refused(kind: str) -> None:
            http_stats.unauthorized[kind] += 1
            if kind in (INGEST, RELAY):
                monitor.reject("unauthorized")

        app.add_middleware(AuthLayer, files=token_files, on_refused=refused)
    # Outermost of all: every answer, 401s included, carries the page's security headers.
    app.add_middleware(SecurityHeaders)
    for module in (actions, captures, diagnose, health, metrics, nodes, page, summaries):
        app.include_router(module.router)
    return app


def _token_files(settings: Settings) -> dict[str, TokenFile]:
    """The configured token files, read now: raises TokenFileError rather than serve open by mistake."""
    paths = {INGEST: settings.token_file, READ: settings.read_token_file, METRICS: settings.metrics_token_file,
             RELAY: settings.relay_token_file}
    files = {kind: TokenFile(path, allow_nodes=kind == INGEST) for kind, path in paths.items() if path is not None}
    if INGEST not in files:
        log.warning("no token file: any client that reaches the monitor can post reports (see --token-file)")
    return files


async def _act_forever(engine: ActionEngine) -> None:
    """Carry out decided actions off the diagnosis pass: a slow command or webhook delays the next
    action, never a verdict."""
    from hangwatch_common.http_client import httpx  # only a monitor with actions needs it

    async with httpx.AsyncClient() as client:
        while True:
            try:
                await engine.run_pending(client)
            except Exception:
                log.exception("carrying out actions failed")
            await asyncio.sleep(ACTIONS_POLL_S)


async def _keep_watchdog_fed(notifier: Notifier, monitor: Monitor) -> None:
    # Runs on the event loop, so a blocked loop starves the watchdog and systemd restarts us. WATCHDOG=1 is
    # liveness only; readiness (/readyz's reasons) goes to STATUS=, which `systemctl status` shows.
    while True:
        notifier.tick()
        notifier.status_on_change(monitor.readiness().status_line())
        await asyncio.sleep(0.5)


async def _tick_forever(monitor: Monitor, guard: LoadGuard, interval_s: float) -> None:
    """A diagnosis pass every ``interval_s``, a few jobs at a time so requests are served in between."""
    gc_tamer = GcTamer(last_full_at=time.monotonic())
    heap = HeapTrimmer()
    while True:
        started = time.monotonic()
        offloaded = 0.0
        try:
            for step in monitor.tick_steps():
                if step is None:
                    await asyncio.sleep(0)
                else:
                    handed = time.monotonic()
                    await asyncio.to_thread(step.run)
                    offloaded += time.monotonic() - handed
            guard.forget(monitor.node_ids())
            if heap.due(time.monotonic()):  # what a flood or forgotten jobs freed goes back to the system
                handed = time.monotonic()
                await asyncio.to_thread(heap.trim)
                offloaded += time.monotonic() - handed
        except Exception:
            log.exception("background diagnosis failed")
        gc_tamer.after_pass(started)
        # Passes take at most PASS_SHARE of the loop: a pass of 0.5 s (10,000 ranks on a slow
        # core) is followed by 0.75 s for reports and reads, so verdicts lag a little, ingest never.
        # Work run on a worker thread meanwhile is not the loop's: the loop served requests then.
        took = time.monotonic() - started
        on_loop = took - offloaded
        await asyncio.sleep(max(interval_s - took, on_loop * (1 - PASS_SHARE) / PASS_SHARE))
