"""Typed dependencies shared by the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from monitor.engine.service import Monitor
from monitor.web.settings import Settings


def get_monitor(request: Request) -> Monitor:
    return request.app.state.monitor


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


MonitorDep = Annotated[Monitor, Depends(get_monitor)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
