"""The monitor's HTTP API fuzzed from its OpenAPI schema with schemathesis, against a real server.

The schema the app serves (``/openapi.json``) has the ingest path, its body from the wire model
itself (monitor/web/openapi.py), so the fuzz follows the format as it changes. It lacks the page
(left out of the schema on purpose): ``api_schema`` adds it.

Used by tests/monitor/test_api_fuzz.py (bounded, in CI) and benchmarks/fuzz_api.py (longer).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, Case, GenerationMode


INGEST = "/api/v1/reports"
BATCHES = "/api/v1/report-batches"
# The batch path gets this fraction of the examples: its bodies are lists of the reports the ingest
# path is fuzzed with already, and generating them is most of the fuzz's time.
BATCH_SHARE = 4
HISTORY = "/api/v1/jobs/{job_id}/history"
# Every answer the ingest layer gives by design (401/403 only with token files, 503 only when shedding).
INGEST_STATUSES = ("202", "400", "401", "403", "413", "415", "422", "429", "503")
REQUEST_TIMEOUT_S = 30.0
# Reads of each job a fuzzed report created, after the fuzz: its verdict rendered every way.
READ_BACK_QUERIES = ({"format": "json"}, {"format": "text"}, {"format": "json", "view": "summary"},
                     {"format": "text", "view": "summary"})
READ_BACK_JOBS = 200
MAX_SHOWN = 4000


def api_schema(served: dict[str, Any]) -> dict[str, Any]:
    """``served`` (the app's /openapi.json, ingest path included: monitor/web/openapi.py) with the page added."""
    schema = copy.deepcopy(served)
    paths = schema["paths"]
    assert INGEST in paths and "Report" in schema["components"]["schemas"], "the served schema lacks ingest"
    # Every answer the fuzz may see, by design.
    assert set(paths[INGEST]["post"]["responses"]) == set(INGEST_STATUSES)
    page = {"200": {"description": "the page", "content": {"text/html": {"schema": {"type": "string"}}}},
            "304": {"description": "unchanged (ETag)"}, "404": {"description": "no such file"}}
    paths["/"] = {"get": {"operationId": "get_page", "responses": page}}
    paths["/static/{name}"] = {"get": {
        "operationId": "get_static",
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": page,
    }}
    return schema


def load_schema(base: str) -> schemathesis.BaseSchema:
    served = httpx.get(f"{base}/openapi.json", timeout=REQUEST_TIMEOUT_S)
    served.raise_for_status()
    return schemathesis.openapi.from_dict(api_schema(served.json()))


@dataclass
class FuzzResult:
    examples: int = 0
    # (operation, status) -> answers
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    # Each as "STATUS OPERATION: curl command that repeats it".
    server_errors: list[str] = field(default_factory=list)
    # Requests that got no answer at all (connection reset, timeout): a crash or a hang.
    crashes: list[str] = field(default_factory=list)
    # Ingest answers that do not say what happened ({"accepted": true} with 202, false otherwise).
    bad_ingest_answers: list[str] = field(default_factory=list)
    # Operations and modes with nothing to generate (a lone string parameter has no invalid value).
    nothing_to_generate: list[str] = field(default_factory=list)
    accepted: int = 0
    refused: int = 0
    # Job ids named by the reports the monitor took (ranks' and launchers').
    accepted_job_ids: set[str] = field(default_factory=set)

    @property
    def failures(self) -> int:
        return len(self.server_errors) + len(self.crashes) + len(self.bad_ingest_answers)

    def summary(self) -> str:
        lines = [f"fuzz: {self.examples} examples, {self.failures} failures "
                 f"({len(self.server_errors)} server errors, {len(self.crashes)} crashes, "
                 f"{len(self.bad_ingest_answers)} bad ingest answers); reports accepted {self.accepted}, "
                 f"refused {self.refused}; jobs created {len(self.accepted_job_ids)}"]
        for (operation, status), count in sorted(self.statuses.items()):
            lines.append(f"  {operation}  {status}: {count}")
        lines += [f"  server error: {e}" for e in self.server_errors[:10]]
        lines += [f"  crash: {e}" for e in self.crashes[:10]]
        lines += [f"  bad ingest answer: {e}" for e in self.bad_ingest_answers[:10]]
        return "\n".join(lines)


def fuzz(base: str, examples: int, *, progress: Callable[[str], None] | None = None) -> FuzzResult:
    """Up to ``examples`` generated requests per operation and mode (valid, invalid; a quarter of that
    for relays' batches), sent to ``base``.

    Reports go first, so the reads that follow render what the fuzzed reports left; then every
    job they created is read back by id. Derandomized: the same schema gives the same requests.
    """
    result = FuzzResult()
    schema = load_schema(base)
    ops = sorted((r.ok() for r in schema.get_all_operations()), key=lambda op: op.path != INGEST)
    with requests.Session() as session:
        def send(case: Case) -> None:
            _send(case, base, session, result)

        for operation in ops:
            for mode in GenerationMode:
                if progress:
                    progress(f"{operation.label} ({mode.value})")
                # A batch holds several reports, each as costly to generate as a report alone.
                count = max(1, examples // BATCH_SHARE) if operation.path == BATCHES else examples
                if not _fuzz_operation(operation, mode, count, send):
                    result.nothing_to_generate.append(f"{operation.label} ({mode.value})")
        if progress:
            progress(f"reading back {min(len(result.accepted_job_ids), READ_BACK_JOBS)} jobs")
        for case in _read_back(schema, sorted(result.accepted_job_ids)[:READ_BACK_JOBS]):
            send(case)
    return result


def _fuzz_operation(operation: APIOperation, mode: GenerationMode, examples: int,
                    send: Callable[[Case], None]) -> bool:
    """False when ``mode`` has nothing to generate (no invalid value exists for any parameter)."""

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                     HealthCheck.large_base_example])
    @given(operation.as_strategy(generation_mode=mode))
    def run(case: Case) -> None:
        send(case)

    try:
        run()
    except Unsatisfiable:
        return False
    return True


def _read_back(schema: schemathesis.BaseSchema, job_ids: list[str]) -> Iterable[Case]:
    diagnose, history = schema["/diagnose"]["GET"], schema[HISTORY]["GET"]
    for job_id in job_ids:
        yield history.Case(path_parameters={"job_id": job_id})
        for query in READ_BACK_QUERIES:
            yield diagnose.Case(query={**query, "job": job_id})


def _send(case: Case, base: str, session: requests.Session, result: FuzzResult) -> None:
    result.examples += 1
    label = case.operation.label
    try:
        response = case.call(base_url=base, session=session, timeout=REQUEST_TIMEOUT_S)
    except requests.RequestException as exc:
        result.crashes.append(f"{label}: {type(exc).__name__}: {exc}; {_repeat(case, base)}")
        return
    status = response.status_code
    result.statuses[(label, status)] += 1
    if status >= 500:
        result.server_errors.append(f"{status} {label}: {_repeat(case, base)}")
    if case.path == INGEST:
        _note_ingest(case, response, result, base)
    elif case.path == BATCHES:
        _note_batch(case, response, result, base)


def _repeat(case: Case, base: str) -> str:
    """The curl command that sends ``case`` again (cut short: a body may be megabytes)."""
    command = case.as_curl_command(base_url=base)
    return command if len(command) <= MAX_SHOWN else command[:MAX_SHOWN] + "..."


def _note_ingest(case: Case, response: requests.Response, result: FuzzResult, base: str) -> None:
    accepted = response.status_code == 202
    try:
        said = response.json()
    except ValueError:
        said = None
    if not isinstance(said, dict) or said.get("accepted") is not accepted:
        result.bad_ingest_answers.append(f"{response.status_code} {response.text[:200]!r}: "
                                         f"{_repeat(case, base)}")
    _count(result, case.body, accepted)


def _note_batch(case: Case, response: requests.Response, result: FuzzResult, base: str) -> None:
    """A relay's batch: each report's own answer, in order, counted as if posted alone."""
    if response.status_code != 200:
        result.refused += 1  # refused whole (the monitor counts it once): nothing was taken
        return
    try:
        results = response.json()["results"]
        entries = case.body["reports"]
        pairs = list(zip(entries, results, strict=True))
    except (ValueError, KeyError, TypeError):
        result.bad_ingest_answers.append(f"200 {response.text[:200]!r}: {_repeat(case, base)}")
        return
    for entry, answer in pairs:
        body = answer.get("body") if isinstance(answer, dict) else None
        accepted = isinstance(answer, dict) and answer.get("status") == 202
        if not isinstance(body, dict) or body.get("accepted") is not accepted:
            result.bad_ingest_answers.append(f"batch entry {answer!r:.200}: {_repeat(case, base)}")
        _count(result, entry["report"], accepted)


def _count(result: FuzzResult, report: dict, accepted: bool) -> None:
    if not accepted:
        result.refused += 1
        return
    result.accepted += 1
    # Taken, so the body was a report: an object whose ranks and launchers are objects.
    for item in [*report.get("ranks", []), *report.get("launchers", [])]:
        if item.get("job_id") is not None:
            result.accepted_job_ids.add(item["job_id"])
