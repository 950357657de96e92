"""``GET /metrics``: a plain route, not a mounted app (a mount answers /metrics with a redirect).

Gzipped when the scraper asks (Prometheus does, ``Accept-Encoding: gzip``): the text is ~1.7 KB per
rank, 17 MB a scrape at 10,000 ranks, and compresses about 20 times.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from monitor.web.exposition import Family
from monitor.web.job_series import JobSeries
from monitor.web.metrics import http_families, load_families, render_metrics
from monitor.web.routes.deps import MonitorDep
from monitor.engine.incidents import SuspectNode
from monitor.engine.published import JobResult, MonitorFigures

router = APIRouter()
# zlib's fastest level: measured on 10,000 simulated ranks (17 MB), 20x smaller in 22 ms; level 6
# is 21x in 92 ms, level 9 (prometheus_client's) 26x in 0.44 s of the monitor's one core.
GZIP_LEVEL = 1


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value takes gzip (RFC 9110 12.5.3): named, or covered by ``*``,
    with a quality above 0. Absent or empty: identity only."""
    qualities: dict[str, float] = {}
    for item in (accept_encoding or "").split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        if not coding:
            continue
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0  # a quality nobody can read is no consent
        qualities[coding.lower()] = quality
    for name in ("gzip", "x-gzip", "*"):
        if name in qualities:
            return qualities[name] > 0
    return False


def scrape_body(results: Sequence[JobResult], figures: MonitorFigures, suspects: Sequence[SuspectNode],
                load: Sequence[Family], http: Sequence[Family], compress: bool, series: JobSeries | None = None) -> bytes:
    body = render_metrics(results, figures, suspects, load, http, series)
    # mtime=0: the same text compresses to the same bytes.
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0) if compress else body


@router.get("/metrics")
async def get_metrics(request: Request, monitor: MonitorDep) -> Response:
    compress = accepts_gzip(request.headers.get("accept-encoding"))
    # What the engine published and the web layer's own figures, taken here on the event loop; rendered
    # (and compressed) on a worker thread from those copies: ~150,000 series at 10,000 ranks must not
    # hold up ingest.
    results, figures = monitor.results(), monitor.figures()
    load, http = load_families(request.app.state.load_guard), http_families(request.app.state.http_stats)
    # The suspect nodes are a database read, at most once a minute: off the event loop too.
    suspects = await run_in_threadpool(monitor.cached_suspect_nodes)
    body = await run_in_threadpool(scrape_body, results, figures, suspects, load, http, compress,
                                   request.app.state.job_series)
    # Vary on both answers: a cache between Prometheus and the monitor keeps the two apart.
    headers = {"Vary": "Accept-Encoding", **({"Content-Encoding": "gzip"} if compress else {})}
    return Response(body, media_type=CONTENT_TYPE_LATEST, headers=headers)
