"""``GET /``: the status page, static files whose script polls ``/diagnose?format=json``.

The page's few files are read once at start and served from memory: a file response reads
through worker threads, several loop round-trips a request, which a busy monitor makes
slow for the person who opens the page mid-incident.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

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
            files[path.name] = StaticFile(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:16] + '"')
    return files


STATIC_FILES = load_static()


def _serve(request: Request, name: str) -> Response:
    found = STATIC_FILES.get(name)
    if found is None:
        raise HTTPException(status_code=404, detail="not found")
    # no-cache: the browser revalidates (a 304 by ETag), so a new version shows at once.
    headers = {"Cache-Control": "no-cache", "ETag": found.etag}
    if request.headers.get("if-none-match") == found.etag:
        return Response(status_code=304, headers=headers)
    return Response(found.body, media_type=found.media_type, headers=headers)


@router.get("/", include_in_schema=False)
async def get_page(request: Request) -> Response:
    return _serve(request, "index.html")


@router.get("/static/{name}", include_in_schema=False)
async def get_static(request: Request, name: str) -> Response:
    return _serve(request, name)
