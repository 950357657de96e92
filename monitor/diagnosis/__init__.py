"""Pure diagnosis: a job's rank snapshots in, a verdict with culprits and evidence out.

The names below are imported on first use (PEP 562): ``hangwatch``'s CLI reads only the verdict
catalogue (monitor/diagnosis/verdict_catalogue.py), and importing the model's and the rules'
modules was a third of its start (~0.1 s of every ``hangwatch diagnose``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monitor.diagnosis.model import (
        VERDICTS,
        Diagnosis,
        ExitView,
        Frame,
        HostFacts,
        Interface,
        JobView,
        LauncherView,
        LogPhase,
        OrphanView,
        RankDiagnosis,
        RankView,
        Socket,
        Stack,
        WaitGroup,
    )
    from monitor.diagnosis.verdict import diagnose

__all__ = [
    "VERDICTS",
    "Diagnosis",
    "ExitView",
    "Frame",
    "HostFacts",
    "Interface",
    "JobView",
    "LauncherView",
    "LogPhase",
    "OrphanView",
    "RankDiagnosis",
    "RankView",
    "Socket",
    "Stack",
    "WaitGroup",
    "diagnose",
]
# The module of this package each name comes from.
_HOMES = {**dict.fromkeys(__all__, "model"), "diagnose": "verdict"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
