"""Evidence captured at the moment of an incident, one bundle per incident, on disk.

When a job's incident verdict has held ``capture_after_s``, the monitor asks each of the job's
agents (in the answer to its next report) for a capture of its ranks; each agent uploads one
part (gzipped JSON: native stacks, Flight Recorder, NCCL RAS state, log tails) that is streamed
straight to a file here, never held whole in memory, so a 10,000-rank job's 1,250 parts cost
the monitor a file each. A bundle is a directory::

    <capture_dir>/<bundle id>/bundle.json        what was asked, of whom, and why
    <capture_dir>/<bundle id>/<node>.json.gz     one agent's part

Bounded: a part at most ``max_part_bytes`` (the upload is cut and the part dropped past it), a
bundle at most ``max_bundle_bytes``, all bundles at most ``max_total_bytes`` and
``retention_s`` old (the oldest go first). No part is written while the volume has less than
``min_free_bytes`` free, or would have once the part is in (monitor/storage/free_space.py): it is
refused with 507, and the bundles kept stay. Downloaded as one tar of its files (``tar_stream``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import tarfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from monitor.storage.free_space import MIN_FREE_BYTES, FreeSpace, VolumeSpace, mib

log = logging.getLogger("hangwatch.captures")

MAX_PART_BYTES = 32 * 1024 * 1024
MAX_BUNDLE_BYTES = 512 * 1024 * 1024
MAX_TOTAL_BYTES = 4 * 1024 * 1024 * 1024
RETENTION_S = 7 * 86400.0
# Where agents upload their parts: <prefix><bundle id>/<node> (routes/captures.py, the relay).
CAPTURE_UPLOAD_PREFIX = "/api/v1/capture-uploads/"
CHUNK = 256 * 1024
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
BUNDLE_ID = re.compile(r"^[A-Za-z0-9._-]{1,160}$")


# Why a part was refused, a label of hangwatch_capture_parts_refused_total; "failed": the upload broke off.
REFUSAL_REASONS = ("expired", "not_asked", "already_sent", "too_large", "low_space", "failed")


class CaptureRefused(Exception):
    """Why an upload is not taken: ``status`` is the HTTP answer (404, 409, 413, 507), ``reason`` one
    of REFUSAL_REASONS."""

    def __init__(self, status: int, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.status, self.detail, self.reason = status, detail, reason


@dataclass
class Bundle:
    id: str
    job_id: str
    verdict: str
    culprit_ranks: list[int]
    incident_started_at: float
    requested_at: float
    # node -> the pids of the job's ranks asked of it
    nodes: dict[str, list[int]]
    # node -> bytes received (a node missing here has not uploaded, or its part was refused)
    received: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    bytes: int = 0  # the sum of ``received``

    def summary(self) -> dict:
        return {"id": self.id, "job_id": self.job_id, "verdict": self.verdict, "culprit_ranks": self.culprit_ranks,
                "incident_started_at": self.incident_started_at, "requested_at": self.requested_at,
                "nodes_asked": len(self.nodes), "nodes_received": len(self.received),
                "bytes": self.bytes, "refused": self.refused,
                "download": f"/api/v1/captures/{self.id}"}


def file_safe(text: str, limit: int = 80) -> str:
    return _SAFE.sub("_", text)[:limit].strip("._") or "x"


class CaptureStore:
    def __init__(self, root: Path, max_part_bytes: int = MAX_PART_BYTES, max_bundle_bytes: int = MAX_BUNDLE_BYTES,
                 max_total_bytes: int = MAX_TOTAL_BYTES, retention_s: float = RETENTION_S,
                 clock=time.time, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self.root = root
        self.max_part_bytes, self.max_bundle_bytes = max_part_bytes, max_bundle_bytes
        self.max_total_bytes, self.retention_s = max_total_bytes, retention_s
        self.clock = clock
        self._lock = threading.Lock()
        self._bundles: dict[str, Bundle] = {}
        self._total_bytes = 0
        self.parts_received = 0
        self.parts_refused = 0
        self.refusals: Counter[str] = Counter()
        self.free_space = FreeSpace("captures", root, min_free_bytes)
        self._load()

    # --- bundles ---

    def open_bundle(self, job_id: str, verdict: str, culprits: list[int], incident_started_at: float,
                    nodes: dict[str, list[int]]) -> Bundle:
        now = self.clock()
        bundle_id = f"{file_safe(job_id)}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(incident_started_at))}"
        with self._lock:
            base, n = bundle_id, 1
            while bundle_id in self._bundles:
                n += 1
                bundle_id = f"{base}-{n}"
            bundle = Bundle(bundle_id, job_id, verdict, culprits, incident_started_at, now, nodes)
            (self.root / bundle_id).mkdir(parents=True, exist_ok=True)
            self._bundles[bundle_id] = bundle
            self._save(bundle)
        self.prune()
        return bundle

    def bundles(self, job_id: str | None = None) -> list[dict]:
        with self._lock:
            found = [b for b in self._bundles.values() if job_id is None or b.job_id == job_id]
        return [b.summary() for b in sorted(found, key=lambda b: b.requested_at)]

    def get(self, bundle_id: str) -> Bundle | None:
        with self._lock:
            return self._bundles.get(bundle_id)

    # --- an upload, streamed to its file ---

    async def receive_part(self, bundle_id: str, node: str, chunks: AsyncIterator[bytes]) -> int:
        """Write one node's part as it arrives; returns its size. Raises CaptureRefused."""
        with self._lock:
            bundle = self._bundles.get(bundle_id)
            refusal = None
            if bundle is None:
                refusal = CaptureRefused(404, f"no capture {bundle_id!r} (expired, or never asked)", "expired")
            elif node not in bundle.nodes:
                refusal = CaptureRefused(409, f"capture {bundle_id} did not ask node {node!r}", "not_asked")
            elif node in bundle.received:
                refusal = CaptureRefused(409, f"node {node!r} already sent its part of {bundle_id}", "already_sent")
            if refusal is not None:
                self._count_refusal(refusal.reason)
                raise refusal
            assert bundle is not None
            room = min(self.max_part_bytes, self.max_bundle_bytes - bundle.bytes)
        path = self.root / bundle_id / f"{file_safe(node, 128)}.json.gz"
        partial = path.with_suffix(".partial")
        size = 0
        try:
            # Read once before writing; the part's own bytes are counted against it as they come.
            space = self.free_space.reading() if self.free_space.min_free_bytes > 0 else None
            if space is not None and space.short:
                raise self._low_space(space.free_bytes)
            with open(partial, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > room:
                        raise CaptureRefused(413, f"part over {room} bytes (the part or bundle limit)", "too_large")
                    if space is not None and space.free_bytes - size < space.min_free_bytes:
                        raise self._low_space(space.free_bytes - size)
                    out.write(chunk)
            os.replace(partial, path)
        except BaseException as exc:
            partial.unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                exc = self._low_space(0)
            with self._lock:
                self._count_refusal(exc.reason if isinstance(exc, CaptureRefused) else "failed")
                if isinstance(exc, CaptureRefused):
                    bundle.refused[node] = exc.detail
                    if exc.reason != "low_space":  # a full volume: saved with the bundle's next write
                        self._save(bundle)
            raise exc
        with self._lock:
            bundle.received[node] = size
            bundle.bytes += size
            self.parts_received += 1
            # bundle.json is written when asked, refused and downloaded, not per part: at 1,250 parts
            # rewriting it (every node's pids) each time cost the monitor 10 times the upload itself.
            self._total_bytes += size
            over = self._total_bytes > self.max_total_bytes
        if over:
            self.prune()
        return size

    def _count_refusal(self, reason: str) -> None:
        self.parts_refused += 1
        self.refusals[reason] += 1

    def _low_space(self, left_bytes: int) -> CaptureRefused:
        """``left_bytes``: what the part would have left free."""
        self.free_space.log_refusal("capture parts", left_bytes)
        return CaptureRefused(507, f"the monitor's capture volume is nearly full (the part would leave "
                                   f"{mib(max(left_bytes, 0))} free, under min_free_bytes "
                                   f"{mib(self.free_space.min_free_bytes)}): part not kept", "low_space")

    def volume(self) -> VolumeSpace | None:
        """The captures' volume now (None: unreadable)."""
        return self.free_space.reading()

    # --- the download: a tar of the bundle's files, read a chunk at a time ---

    def tar_stream(self, bundle_id: str) -> Iterator[bytes]:
        folder = self.root / bundle_id
        with self._lock:
            bundle = self._bundles.get(bundle_id)
            if bundle is not None:
                self._save(bundle)  # what was received so far, into the archive
        names = ["bundle.json"] + sorted(p.name for p in folder.glob("*.json.gz"))
        for name in names:
            path = folder / name
            try:
                st = path.stat()
            except OSError:
                continue
            info = tarfile.TarInfo(f"{bundle_id}/{name}")
            info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), 0o644
            yield info.tobuf(format=tarfile.PAX_FORMAT)
            sent = 0
            with open(path, "rb") as f:
                while sent < st.st_size:
                    chunk = f.read(min(CHUNK, st.st_size - sent))
                    if not chunk:
                        break
                    sent += len(chunk)
                    yield chunk
            if sent < st.st_size:
                yield b"\0" * (st.st_size - sent)  # shrank meanwhile: keep the archive whole
            if st.st_size % tarfile.BLOCKSIZE:
                yield b"\0" * (tarfile.BLOCKSIZE - st.st_size % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)

    # --- bounds ---

    def prune(self) -> None:
        """Drop bundles past the retention, then the oldest while all of them take too much room."""
        now = self.clock()
        with self._lock:
            ordered = sorted(self._bundles.values(), key=lambda b: b.requested_at)
            doomed = []
            for bundle in ordered:
                if now - bundle.requested_at > self.retention_s or self._total_bytes > self.max_total_bytes:
                    doomed.append(bundle)
                    self._total_bytes -= bundle.bytes
            for bundle in doomed:
                del self._bundles[bundle.id]
        for bundle in doomed:
            shutil.rmtree(self.root / bundle.id, ignore_errors=True)
            log.info("capture %s removed (retention %.0fs, room %d bytes)", bundle.id, self.retention_s,
                     self.max_total_bytes)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._total_bytes

    # --- the metadata file ---

    def _save(self, bundle: Bundle) -> None:
        path = self.root / bundle.id / "bundle.json"
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(bundle), indent=1))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("capture %s: cannot write %s: %s", bundle.id, path, exc.strerror or exc)

    def _load(self) -> None:
        """The bundles a previous run of the monitor kept."""
        try:
            folders = [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            return
        for folder in folders:
            try:
                raw = json.loads((folder / "bundle.json").read_text())
                bundle = Bundle(**raw)
            except (OSError, ValueError, TypeError):
                continue
            if bundle.id != folder.name or not BUNDLE_ID.match(bundle.id):
                continue
            # The parts on disk are what was received (bundle.json is not rewritten per part).
            bundle.received = {n: (folder / f"{file_safe(n, 128)}.json.gz").stat().st_size for n in bundle.nodes
                               if (folder / f"{file_safe(n, 128)}.json.gz").exists()}
            bundle.bytes = sum(bundle.received.values())
            self._total_bytes += bundle.bytes
            self._bundles[bundle.id] = bundle
