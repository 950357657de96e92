"""/metrics is gzipped when the scraper asks (Prometheus does): the real monitor on uvicorn, over
loopback, with httpx and the standard library's own HTTP client; promtool reads what it decompresses."""

from __future__ import annotations

import gzip
import http.client
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from monitor_reports import progress, rank, report, stack
from prometheus_client.parser import text_string_to_metric_families
from real_monitor import running_monitor

from monitor.web.routes.metrics import accepts_gzip

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
NODES, RANKS_PER_NODE = 32, 8
SCRAPER = "scraper-token-0123456789abcdef"


@pytest.mark.parametrize(("header", "gzip_it"), [
    (None, False),
    ("", False),
    ("identity", False),
    ("gzip", True),
    ("GZip", True),
    ("gzip, deflate", True),
    ("gzip, deflate, br, zstd", True),
    ("deflate, br", False),
    ("br;q=1.0, gzip;q=0.5", True),
    ("gzip;q=0", False),
    ("gzip; q=0.000", False),
    ("gzip;q=nonsense", False),
    ("*", True),
    ("*;q=0", False),
    ("gzip;q=0, *", False),  # named and refused: * does not bring it back
    ("identity, *;q=0", False),
    ("x-gzip", True),
])
def test_accept_encoding_is_read_as_rfc_9110_says(header: str | None, gzip_it: bool) -> None:
    assert accepts_gzip(header) is gzip_it


def many_ranks_reports() -> list[dict]:
    """32 nodes of 8 ranks in 4 jobs, with progress and stacks: every per-rank family has series."""
    reports = []
    for node in range(NODES):
        job = node // 8
        ranks = [rank(job_id=f"10.0.{job}.1:29500", rank=(node % 8) * RANKS_PER_NODE + i, world_size=64,
                      progress=progress(40, 40, [(1.0 * s, s) for s in range(35, 41)]), stack=stack(40.0),
                      cmdline=f"/opt/venv/bin/python -u /work/train.py --seed {i}")
                 for i in range(RANKS_PER_NODE)]
        reports.append(report(node=f"gpu-node-{node:03d}", ranks=ranks))
    return reports


def raw_scrape(base: str, accept_encoding: str | None,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET /metrics with exactly this Accept-Encoding (None: no such header at all); the body as sent."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.putrequest("GET", "/metrics", skip_accept_encoding=True)
        if accept_encoding is not None:
            conn.putheader("Accept-Encoding", accept_encoding)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def rank_series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The per-rank series of a scrape (their values are the same from one scrape to the next)."""
    return {(s.name, tuple(sorted(s.labels.items())))
            for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("hangwatch_rank_")}


def test_metrics_are_gzipped_when_asked_and_plain_when_not(tmp_path: Path) -> None:
    with running_monitor(tmp_path) as monitor:
        for body in many_ranks_reports():
            assert httpx.post(monitor.base + "/api/v1/reports", json=body, timeout=30).status_code == 202

        status, headers, packed = raw_scrape(monitor.base, "gzip")
        assert status == 200
        assert headers["content-encoding"] == "gzip" and headers["vary"] == "Accept-Encoding"
        assert headers["content-type"].startswith("text/plain; version=")
        assert int(headers["content-length"]) == len(packed)
        text = gzip.decompress(packed).decode()

        for asked in (None, "identity", "deflate, br", "gzip;q=0"):
            status, plain_headers, plain = raw_scrape(monitor.base, asked)
            assert status == 200, asked
            assert "content-encoding" not in plain_headers and plain_headers["vary"] == "Accept-Encoding", asked
            assert rank_series(plain.decode()) == rank_series(text), asked

        # 256 ranks: every per-rank family of every rank, the same series either way.
        series = rank_series(text)
        assert len({labels for name, labels in series if name == "hangwatch_rank_alive"}) == NODES * RANKS_PER_NODE
        ratio = len(plain) / len(packed)
        assert ratio > 10, f"{len(plain)} bytes plain, {len(packed)} gzipped: only {ratio:.1f}x"

        # httpx asks for gzip by default and undoes it: what every Python scraper sees is the text.
        decoded = httpx.get(monitor.base + "/metrics", timeout=30)
        assert decoded.headers["content-encoding"] == "gzip" and rank_series(decoded.text) == series

    # The decompressed body is clean Prometheus text.
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), (
        f"promtool check metrics: rc={check.returncode}\n{check.stdout}{check.stderr}")


def test_metrics_token_is_checked_before_anything_is_compressed(tmp_path: Path) -> None:
    scrapers = tmp_path / "metrics.token"
    scrapers.write_text(SCRAPER + "\n")
    scrapers.chmod(0o600)
    with running_monitor(tmp_path, "--metrics-token-file", str(scrapers)) as monitor:
        assert httpx.post(monitor.base + "/api/v1/reports", json=many_ranks_reports()[0], timeout=30).status_code == 202
        status, headers, body = raw_scrape(monitor.base, "gzip")
        assert status == 401 and "content-encoding" not in headers and b"hangwatch_rank" not in body
        status, headers, body = raw_scrape(monitor.base, "gzip", {"Authorization": "Bearer not-the-token-at-all"})
        assert status == 401 and b"hangwatch_rank" not in body
        status, headers, body = raw_scrape(monitor.base, "gzip", {"Authorization": f"Bearer {SCRAPER}"})
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert "hangwatch_rank_alive{" in gzip.decompress(body).decode()
