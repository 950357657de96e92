"""The real monitor under fuzzed and hostile requests: no 5xx, no crash, and a refusal changes nothing.

The fuzz is generated from the API's schema (api_fuzz.py, schemathesis), bounded and derandomized
so CI runs the same requests every time; benchmarks/fuzz_api.py runs it longer. The hostile
bodies below are ones a schema-driven generator never writes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from api_fuzz import INGEST, fuzz
from monitor_reports import launcher, rank, report
from prometheus_client.parser import text_string_to_metric_families
from real_monitor import RunningMonitor, running_monitor

# Per operation and mode (valid, invalid): ~510 requests, ~30 s on 2 idle cores, nearly all of it
# hypothesis generating reports and batches. The examples differ with the count (derandomized per
# count, not a prefix of a longer run): 25 reach every (operation, status) pair and as many lines
# of monitor/ as 40 did (5,861 against 5,724, measured with coverage) for 57% of the CPU time.
EXAMPLES = 25
BASELINE_JOB = "fuzz-baseline"
# However slow the machine, no report is shed: here a 503 would be a server error like any other.
NO_SHEDDING = {"HANGWATCH_SHED_LAG_S": "3600"}
JSON = {"content-type": "application/json"}
MiB = 1024 * 1024


@dataclass(frozen=True)
class Seen:
    """What the monitor holds, as its answers say."""

    jobs: frozenset[str]
    # Reports taken: applied, or (replayed ones too old to apply) answered 202 and dropped.
    reports: int
    refused: int
    refused_too_large: int


def seen(base: str) -> Seen:
    jobs = httpx.get(f"{base}/diagnose", params={"format": "json"}, timeout=30)
    assert jobs.status_code == 200, jobs.text
    metrics = httpx.get(f"{base}/metrics", timeout=30)
    assert metrics.status_code == 200, metrics.text
    samples = {(s.name, s.labels.get("reason")): s.value
               for family in text_string_to_metric_families(metrics.text) for s in family.samples}
    return Seen(
        jobs=frozenset(j["job_id"] for j in jobs.json()["jobs"]),
        reports=int(samples[("hangwatch_reports_total", None)]
                    + samples.get(("hangwatch_monitor_reports_replay_dropped_total", None), 0)),
        refused=int(sum(v for (name, _), v in samples.items() if name == "hangwatch_reports_rejected_total")),
        refused_too_large=int(samples[("hangwatch_reports_rejected_total", "too_large")]),
    )


@pytest.mark.live  # a real monitor for a minute: handed out with the live tiers, not last with the quick ones
# ~30 s on 2 idle cores, 250-300 s beside the suite's other workers (the same CPU, a sixth of a core).
@pytest.mark.timeout(900)
def test_fuzzed_requests_get_no_server_error_and_refused_reports_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_monitor(tmp_path, extra_env=NO_SHEDDING) as monitor:
        baseline = report(node="fuzz-baseline-node", ranks=[rank(job_id=BASELINE_JOB)])
        assert httpx.post(monitor.base + INGEST, json=baseline, timeout=30).status_code == 202
        before = seen(monitor.base)
        assert before.jobs == {BASELINE_JOB} and before.reports == 1

        started = time.monotonic()
        result = fuzz(monitor.base, EXAMPLES)
        with capsys.disabled():
            print(f"\n{result.summary()}\nfuzz took {time.monotonic() - started:.1f} s")

        assert not result.server_errors, "\n".join(result.server_errors)
        assert not result.crashes, "\n".join(result.crashes)
        assert not result.bad_ingest_answers, "\n".join(result.bad_ingest_answers)
        assert monitor.proc.poll() is None, monitor.log_text()
        # Meaningful only if valid requests were made for every operation, and reports both taken and refused.
        assert not [n for n in result.nothing_to_generate if "(positive)" in n], result.nothing_to_generate
        assert result.accepted > 0 and result.refused > 0, result.summary()
        after = seen(monitor.base)
        assert BASELINE_JOB in after.jobs
        assert after.jobs <= {BASELINE_JOB} | result.accepted_job_ids, after.jobs - result.accepted_job_ids
        assert after.reports == 1 + result.accepted
        assert after.refused == before.refused + result.refused
        # The background diagnosis ran over the fuzzed reports too: a failure there is only logged.
        assert "Traceback" not in monitor.log_text(), monitor.log_text()


def _report_with(fields: bytes) -> bytes:
    return b'{"schema_version": 1, "node": "node-hostile", "sent_at": 1.0, ' + fields + b"}"


HOSTILE_BODIES = {
    "NaN": b'{"schema_version": 1, "node": "node-hostile", "sent_at": NaN}',
    "Infinity in a rank": _report_with(
        b'"ranks": [{"job_id": "j", "rank": 0, "world_size": 1, "pid": 1, "cpu_percent": Infinity}]'),
    "100,000 nested arrays": b"[" * 100_000,
    "100,000 nested objects": b'{"a": ' * 100_000,
    "an unknown field nested 1,000 deep": _report_with(b'"extra": ' + b"[" * 1000 + b"]" * 1000),
    "a string that is not UTF-8": _report_with(b'"agent": {"version": "\xff\xfe"}'),
    "bytes that are not UTF-8": bytes(range(256)) * 4,
}


# One monitor for the tests below (a start is ~1.3 s of CPU, several on a loaded machine): each
# compares counts before and after its own request, or reads back what it posted itself.
@pytest.fixture(scope="module")
def shared_monitor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMonitor]:
    with running_monitor(tmp_path_factory.mktemp("hostile"), extra_env=NO_SHEDDING) as monitor:
        yield monitor


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES)
def test_hostile_bodies_are_refused_and_change_nothing(shared_monitor: RunningMonitor, body: bytes) -> None:
    before = seen(shared_monitor.base)
    answer = httpx.post(shared_monitor.base + INGEST, content=body, headers=JSON, timeout=30)
    assert answer.status_code == 422, answer.text
    assert answer.json()["accepted"] is False
    after = seen(shared_monitor.base)
    assert (after.jobs, after.reports, after.refused) == (before.jobs, before.reports, before.refused + 1)
    assert shared_monitor.proc.poll() is None


@pytest.mark.parametrize("path", ["/diagnose?job=%ff%fe", "/diagnose?format=json&job=%ff", "/diagnose?job=%00",
                                  "/api/v1/jobs/%ff/history", "/static/%ff", "/static/..%2f..%2fpyproject.toml"])
def test_reads_with_bytes_that_are_not_utf8_get_an_answer(shared_monitor: RunningMonitor, path: str) -> None:
    answer = httpx.get(shared_monitor.base + path, timeout=30)
    assert answer.status_code in (200, 404), answer.text


def test_times_no_clock_can_show_are_still_read_back(shared_monitor: RunningMonitor) -> None:
    """Found by benchmarks/fuzz_api.py: the text view printed each verdict's start with localtime()."""
    exited = {"alive": False, "exit": {"at": 1e300, "code": 1}}
    reports = {
        "exit-1e300": report(node="node-a", ranks=[rank(job_id="exit-1e300", **exited)]),
        "exit-1e17": report(node="node-b", ranks=[rank(job_id="exit-1e17", alive=False, exit={"at": 1e17})]),
        # The agent's clock 1e20 s behind: its "now" becomes 1e20 s ahead on the monitor's clock.
        "clock-behind": report(node="node-c", sent_at=-1e20,
                               ranks=[rank(job_id="clock-behind", alive=False, exit={"at": time.time()})]),
        "launcher-exit-1e300": report(node="node-d", ranks=[],
                                      launchers=[{"pid": 5, "job_id": "launcher-exit-1e300", **exited}]),
    }
    base = shared_monitor.base
    for body in reports.values():
        assert httpx.post(base + INGEST, json=body, timeout=30).status_code == 202
    queries = [{"format": f, "view": v} for f in ("text", "json") for v in ("full", "summary")]
    queries += [{"job": job} for job in reports]
    failed = [q for q in queries if httpx.get(base + "/diagnose", params=q, timeout=30).status_code >= 500]
    assert not failed, f"/diagnose answered 5xx for {failed}"


@pytest.mark.parametrize("nnodes", ["¹", "①", "2:²"])
def test_a_launcher_size_in_digits_int_cannot_read_breaks_no_answer(shared_monitor: RunningMonitor, nnodes: str) -> None:
    """Found by benchmarks/fuzz_api.py: str.isdigit() is true of "¹" and "①", int() refuses them."""
    bad = report(node="node-l", ranks=[], launchers=[launcher(job_id="job-l", nnodes=nnodes, nproc_per_node="2")])
    base = shared_monitor.base
    assert httpx.post(base + INGEST, json=bad, timeout=30).status_code == 202
    for path, query in [("/diagnose", {"format": "json"}), ("/diagnose", {"format": "text"}), ("/metrics", {})]:
        answer = httpx.get(base + path, params=query, timeout=30)
        assert answer.status_code == 200, (path, query, answer.text)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_200_mb_chunked_body_is_refused_without_being_held(shared_monitor: RunningMonitor) -> None:
    base, pid = shared_monitor.base, shared_monitor.proc.pid
    before = seen(base)
    rss_before = peak = _rss(pid)
    sent = 0

    def body() -> Iterator[bytes]:
        # A generator goes out chunked, without Content-Length: the monitor must count as it reads.
        nonlocal sent, peak
        chunk = b" " * MiB
        for _ in range(200):
            yield chunk
            sent += len(chunk)
            peak = max(peak, _rss(pid))

    # httpx reads the answer even when the monitor closes the connection under its upload.
    answer = httpx.post(base + INGEST, content=body(), headers=JSON, timeout=60)
    assert answer.status_code == 413, answer.text
    # The monitor answered and closed at the limit: the rest of the stream was never sent.
    assert answer.headers.get("connection") == "close"
    assert sent < 100 * MiB, f"{sent / MiB:.0f} MiB were sent before the connection closed"
    assert peak - rss_before < 100 * MiB, f"RSS grew by {(peak - rss_before) / MiB:.0f} MiB"
    after = seen(base)
    assert (after.jobs, after.reports, after.refused) == (before.jobs, before.reports, before.refused + 1)
    assert httpx.get(base + "/healthz", timeout=30).status_code == 200
