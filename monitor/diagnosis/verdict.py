"""Placeholder until the real rules land (being written now)."""

from __future__ import annotations

from monitor.diagnosis.model import Diagnosis, JobView, RankDiagnosis


def diagnose(job: JobView) -> Diagnosis:
    ranks = tuple(RankDiagnosis(rank=r.rank, state="unknown") for r in job.ranks)
    if job.ranks and all(not r.alive and r.exit and not r.exit.failed for r in job.ranks):
        return Diagnosis("finished", (), None, "every rank ended normally", ranks=ranks)
    return Diagnosis("healthy", (), None, "placeholder", ranks=ranks)
