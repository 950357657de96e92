"""The monitor's HTTP API fuzzed from its schema at length, against a fresh real monitor.

    python benchmarks/fuzz_api.py [--examples 2000] [--json out.json]

Runs the fuzz of tests/monitor/test_api_fuzz.py (tests/monitor/api_fuzz.py: schemathesis, from
the test extra) with ``--examples`` generated requests per operation and mode (valid, invalid),
then probes the ingest size limit from both sides, with Content-Length and chunked. It prints:

- examples run, answers by operation and status, reports taken and refused, jobs created;
- server errors (5xx) and crashes (no answer): both must be 0, or it exits 1;
- the largest report body taken (202) and the smallest refused for size (413), each way;
- the monitor's peak RSS.

Otherwise it asserts nothing: figures go in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "monitor"))

from api_fuzz import INGEST, fuzz  # noqa: E402
from monitor_reports import rank, report  # noqa: E402
from real_monitor import running_monitor  # noqa: E402

from monitor.web.settings import Settings  # noqa: E402

LIMIT = Settings.max_body_bytes
# Sizes tried around the limit: just under, at, just over.
OFFSETS = (-2, -1, 0, 1, 2)
CHUNK = 1024 * 1024


def padded_report(size: int) -> bytes:
    """A valid report of exactly ``size`` bytes (an unknown field pads it; the monitor ignores it)."""
    head = json.dumps(report(node="size-probe", ranks=[rank(job_id="size-probe")]))[:-1] + ', "padding": "'
    tail = '"}'
    body = (head + "x" * (size - len(head) - len(tail)) + tail).encode()
    assert len(body) == size
    return body


def _chunks(body: bytes) -> Iterator[bytes]:
    for start in range(0, len(body), CHUNK):
        yield body[start:start + CHUNK]


def probe_limit(base: str) -> dict[str, dict[str, int | None]]:
    """Per way of sending: the largest size answered 202 and the smallest answered 413."""
    found: dict[str, dict[str, int | None]] = {}
    with httpx.Client(timeout=60) as client:
        for way in ("content-length", "chunked"):
            taken: list[int] = []
            refused: list[int] = []
            for offset in OFFSETS:
                body = padded_report(LIMIT + offset)
                content = body if way == "content-length" else _chunks(body)
                status = client.post(base + INGEST, content=content,
                                     headers={"content-type": "application/json"}).status_code
                if status == 202:
                    taken.append(len(body))
                elif status == 413:
                    refused.append(len(body))
                print(f"  {way:15} {len(body):>9} bytes (limit {offset:+d}): {status}", flush=True)
            found[way] = {"largest_taken": max(taken, default=None), "smallest_refused": min(refused, default=None)}
    return found


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="per operation and mode (default 2000)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hangwatch-fuzz-") as tmp, \
            running_monitor(Path(tmp), extra_env={"HANGWATCH_SHED_LAG_S": "3600"}) as monitor:
        started = time.monotonic()
        result = fuzz(monitor.base, args.examples,
                      progress=lambda step: print(f"[{time.monotonic() - started:6.0f} s] {step}", flush=True))
        took = time.monotonic() - started
        print(result.summary())
        print(f"fuzz took {took:.0f} s ({result.examples / took:.0f} requests/s)")
        print(f"nothing to generate: {', '.join(result.nothing_to_generate) or 'none'}")
        print(f"ingest size limit {LIMIT} bytes:")
        limit = probe_limit(monitor.base)
        alive = monitor.proc.poll() is None
        log = monitor.log_text()
        tracebacks = log.count("Traceback")
        if tracebacks:
            # The log goes with the temporary directory: show the newest traceback now.
            print("the monitor's last traceback:\n" + log[log.rindex("Traceback"):][-4000:])
        rss = peak_rss(monitor.proc.pid) if alive else 0

    for way, sizes in limit.items():
        print(f"{way}: largest taken {sizes['largest_taken']}, smallest refused for size {sizes['smallest_refused']}")
    print(f"server errors {len(result.server_errors)}, crashes {len(result.crashes)}, "
          f"bad ingest answers {len(result.bad_ingest_answers)}, tracebacks logged {tracebacks}, "
          f"monitor alive {alive}, peak RSS {rss / 2**20:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps({
            "examples": result.examples, "seconds": round(took, 1),
            "statuses": {f"{op} {status}": n for (op, status), n in sorted(result.statuses.items())},
            "accepted": result.accepted, "refused": result.refused, "jobs_created": len(result.accepted_job_ids),
            "server_errors": result.server_errors, "crashes": result.crashes,
            "bad_ingest_answers": result.bad_ingest_answers, "size_limit": limit, "peak_rss_bytes": rss,
        }, indent=2))
    return 1 if result.failures or tracebacks or not alive else 0


if __name__ == "__main__":
    sys.exit(main())
