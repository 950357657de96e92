"""``GET /``: the status page, static files whose script polls ``/diagnose?format=json``; and
``GET /runbook``, the runbook the page and the alerts link to (monitor/web/runbook.py).

The page's few files are read once at start and served from memory: a file response reads
through worker threads, several loop round-trips a request, which a busy monitor makes
slow for the person who opens the page mid-incident.
"""

from __future__ import annotations

import functools
import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from monitor.web import runbook

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter()


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str


def load_static(directory: Path = STATIC_DIR) -> dict[str, StaticFile]:
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file():
            body = path.read_bytes()
            media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            if media_type.startswith("text/") or media_type == "application/javascript":
                media_type += "; charset=utf-8"
            files[path.name] = _static_file(body, media_type)
    return files


def _static_file(body: bytes, media_type: str) -> StaticFile:
    return StaticFile(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:16] + '"')


STATIC_FILES = load_static()


@functools.cache
def runbook_page() -> StaticFile:
    """The runbook rendered once, by its first reader (the page then comes from memory like the rest)."""
    page = runbook.render_runbook(runbook.SOURCE.read_text(encoding="utf-8"))
    return _static_file(page.encode(), "text/html; charset=utf-8")


def _serve(request: Request, found: StaticFile | None) -> Response:
    if found is None:
        raise HTTPException(status_code=404, detail="not found")
    # no-cache: the browser revalidates (a 304 by ETag), so a new version shows at once.
    headers = {"Cache-Control": "no-cache", "ETag": found.etag}
    if request.headers.get("if-none-match") == found.etag:
        return Response(status_code=304, headers=headers)
    return Response(found.body, media_type=found.media_type, headers=headers)


@router.get("/", include_in_schema=False)
async def get_page(request: Request) -> Response:
    return _serve(request, STATIC_FILES.get("index.html"))


@router.get(runbook.RUNBOOK_PATH, include_in_schema=False)
async def get_runbook(request: Request) -> Response:
    return _serve(request, runbook_page())


@router.get("/static/{name}", include_in_schema=False)
async def get_static(request: Request, name: str) -> Response:
    return _serve(request, STATIC_FILES.get(name))
