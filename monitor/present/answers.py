"""``GET /diagnose?format=json`` as bytes, built from the latest diagnoses without redoing work.

Each job's JSON is rendered once per diagnosis of that job (orjson) and kept until the job is
diagnosed again, so the answer for thousands of jobs is mostly a join of cached pieces. Views:

- ``full`` (the default): every field of the contract, ranks included;
- ``summary``: one small object per job (verdict, culprits, summary, sizes), no ranks: what
  a page or a script polling a whole cluster needs.

``problems`` keeps only jobs whose verdict is an alarm; ``offset``/``limit`` page through the
jobs in the answer's order. ``total_jobs`` counts the jobs before paging.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from monitor.diagnosis.verdict_catalogue import QUIET
from monitor.present.job_answer import job_dict, job_head
from monitor.engine.published import JobResult

QUIET_VERDICTS = QUIET
VIEWS = ("full", "summary")
# A job whose full answer was asked for this recently is being watched (a person's `watch curl`,
# the page, a script polling during a stall): its next diagnoses are rendered ahead of the reads.
WATCHED_S = 15.0


def summary_dict(result: JobResult) -> dict[str, Any]:
    view = result.view
    return {
        **job_head(result),
        "world_size": view.world_size,
        "ranks_seen": len(view.ranks),
        "nodes": len(view.hosts),
        "last_report_at": result.last_report_at,
        "last_progress_at": result.last_progress_at,
        "job_step": view.job_step,
        "now": view.now,
    }


def dumps(data: Any) -> bytes:
    try:
        return orjson.dumps(data)
    except TypeError:
        # orjson refuses integers past 64 bits; the standard library writes them.
        return json.dumps(data).encode()


@dataclass
class _Rendered:
    result: JobResult
    body: bytes


class AnswerCache:
    """Rendered jobs, per view, valid while the job's latest diagnosis is the one rendered."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._rendered: dict[str, dict[str, _Rendered]] = {view: {} for view in VIEWS}
        self._clock = clock
        self._asked_at: dict[str, float] = {}
        # Per watched giant job, the diagnosis whose full answer is being rendered ahead.
        self._ahead: dict[str, JobResult] = {}

    def job_bytes(self, result: JobResult, view: str) -> bytes:
        if view == "full":
            job_id = result.view.job_id
            self._asked_at[job_id] = self._clock()
            if self._ahead.get(job_id) is result:
                previous = self._rendered["full"].get(job_id)
                if previous is not None:
                    # Its answer is being rendered ahead: the previous diagnosis's answer (a pass
                    # older, ~1 s) now, not a second rendering of 10,000 ranks beside the first.
                    # Measured on 2 cores: reads that rendered beside the render-ahead took
                    # 100-450 ms, both renders slowed by the other (benchmarks/README.md).
                    return previous.body
        return self._job_bytes(result, view)

    def render_ahead(self, result: JobResult) -> Callable[[], None] | None:
        """Called as a giant job's new diagnosis is published: if its job is watched, the work of
        rendering its full answer before anyone asks, to run on a worker thread (a read then only
        copies bytes, instead of waiting ~0.1-1 s for 10,000 ranks to render on a busy monitor);
        until that work is done, reads get the previous answer. None when nobody watches."""
        job_id = result.view.job_id
        asked = self._asked_at.get(job_id)
        if asked is None or self._clock() - asked > WATCHED_S:
            return None
        self._ahead[job_id] = result

        def render() -> None:
            try:
                self._job_bytes(result, "full")
            finally:
                if self._ahead.get(job_id) is result:
                    del self._ahead[job_id]

        return render

    def _job_bytes(self, result: JobResult, view: str) -> bytes:
        cache = self._rendered[view]
        hit = cache.get(result.view.job_id)
        if hit is not None and hit.result is result:
            return hit.body
        data = job_dict(result) if view == "full" else summary_dict(result)
        body = dumps(data)
        cache[result.view.job_id] = _Rendered(result, body)
        return body

    def forget_missing(self, live: Collection[str]) -> None:
        """Drop what was kept for jobs the monitor no longer holds (``live``: the ids it holds)."""
        for cache in self._rendered.values():
            for job_id in set(cache) - set(live):
                del cache[job_id]
        for job_id in set(self._asked_at) - set(live):
            del self._asked_at[job_id]
        for job_id in set(self._ahead) - set(live):
            self._ahead.pop(job_id, None)


def select(
    results: Sequence[JobResult], problems: bool, offset: int, limit: int | None
) -> tuple[list[JobResult], int]:
    """The page of jobs to answer with, and how many jobs matched before paging."""
    chosen = [r for r in results if not problems or r.diagnosis.verdict not in QUIET_VERDICTS]
    return chosen[offset : offset + limit if limit is not None else None], len(chosen)


def answer_bytes(jobs: Sequence[bytes], total_jobs: int, monitor_status: dict[str, Any]) -> bytes:
    return b'{"jobs":[' + b",".join(jobs) + b'],"total_jobs":' + str(total_jobs).encode() + \
        b',"monitor":' + dumps(monitor_status) + b"}"
