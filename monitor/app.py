"""Builds the monitor's FastAPI app: ``create_app(settings, store)``, no module-level globals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from agent.sdnotify import Notifier
from monitor.metrics import build_registry
from monitor.routes import diagnose, ingest, metrics, page
from monitor.routes.page import STATIC_DIR
from monitor.service import Monitor
from monitor.settings import Settings
from monitor.store import Store

log = logging.getLogger("hangwatch.monitor")


def create_app(settings: Settings, store: Store, clock: Callable[[], float] = time.time) -> FastAPI:
    """The app over an open ``store``; the caller owns the store and closes it after the app stops.

    State is rebuilt from the store's recent reports here, so a restarted monitor keeps its picture.
    """
    monitor = Monitor(store, job_retention_s=settings.job_retention_s, clock=clock)
    replayed = monitor.replay()
    if replayed:
        log.info("replayed %d stored reports", replayed)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = []
        if settings.tick_interval_s > 0:
            tasks.append(asyncio.create_task(_tick_forever(monitor, settings.tick_interval_s)))
        notifier = Notifier.from_env()
        if notifier.enabled:
            tasks.append(asyncio.create_task(_keep_watchdog_fed(notifier)))
            notifier.ready(f"serving; {len(monitor.state.jobs)} jobs replayed")
        try:
            yield
        finally:
            notifier.stopping()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            notifier.close()

    app = FastAPI(title="hangwatch monitor", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.monitor = monitor
    app.state.registry = build_registry(monitor)
    for module in (ingest, diagnose, metrics, page):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


async def _keep_watchdog_fed(notifier: Notifier) -> None:
    # Runs on the event loop, so a blocked loop starves the watchdog and systemd restarts us.
    while True:
        notifier.tick()
        await asyncio.sleep(0.5)


async def _tick_forever(monitor: Monitor, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            monitor.tick()
        except Exception:
            log.exception("background diagnosis failed")
