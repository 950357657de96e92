"""Pure diagnosis: a job's rank snapshots in, a verdict with culprits and evidence out."""

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
