"""How the ``hangwatch`` commands ask the monitors: a GET with the run's read token, certificate
check and timeout; each way a monitor can fail to answer, as one line naming it; and /diagnose
asked of every monitor at once (sharded monitors each hold a share of the jobs)."""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse


@dataclass(frozen=True)
class Access:
    """What every request to the monitors carries: the read token (and the file it came from),
    and what verifies an https monitor's certificate (httpx's ``verify``)."""

    token: str | None = None
    token_file: str | None = None
    verify: ssl.SSLContext | bool = True


class MonitorFailure(Exception):
    """A monitor that gave no usable answer; the message is one line naming it."""

    def __init__(self, monitor: str, why: str) -> None:
        super().__init__(f"monitor {monitor} {why}")
        self.monitor = monitor


class Unreadable(MonitorFailure):
    """A monitor answered, but not what this hangwatch reads (another version, or not a monitor)."""

    def __init__(self, monitor: str, why: str) -> None:
        super().__init__(monitor, f"answered something this hangwatch cannot read: {why}{_base_url_hint(monitor)}")


class Unreachable(MonitorFailure):
    def __init__(self, monitor: str, error: Exception) -> None:
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in str(error):
            hint = " -- its certificate is not trusted: --ca-file names the CA bundle that signed it"
        super().__init__(monitor, f"unreachable: {error or type(error).__name__}{hint}")


class NoAnswer(MonitorFailure):
    """Connected (or still connecting) but silent past the timeout."""

    def __init__(self, monitor: str, timeout: float, named: str) -> None:
        super().__init__(monitor, f"unreachable: no answer within {timeout:g}s ({named})")


class Refused(MonitorFailure):
    """401/403: the monitor wants a read token, or not this one."""

    def __init__(self, monitor: str, status: int, access: Access) -> None:
        if access.token is None:
            why = "it wants a read token: pass --token-file PATH (or set HANGWATCH_READ_TOKEN_FILE)"
        else:
            why = (f"it refused the read token in {access.token_file}: pass --token-file with one of the "
                   "tokens of the monitor's --read-token-file")
        super().__init__(monitor, f"answered HTTP {status}: {why}")


class NotFound(MonitorFailure):
    """404 for /diagnose itself (not the monitor's "no such job"): not a monitor's base URL."""

    def __init__(self, monitor: str) -> None:
        super().__init__(monitor, f"answered HTTP 404 for {monitor}/diagnose: not a hangwatch monitor's address"
                                  f"{_base_url_hint(monitor)}")


def _base_url_hint(monitor: str) -> str:
    """For a URL with a path (``http://host:8787/diagnose``): the base URL to give instead.
    A path can be right (a monitor behind a proxy under a prefix), so it is a hint when the
    answer was wrong, never a refusal."""
    u = urlparse(monitor)
    if u.path in ("", "/"):
        return ""
    return f" -- give the monitor's base URL: {u.scheme}://{u.netloc}"


@dataclass(frozen=True)
class Ask:
    """One run's questions: of which monitors, which job (None: all), with what access, how long to
    wait for each monitor."""

    monitors: list[str]
    job: str | None
    access: Access
    timeout: float
    timeout_named: str  # what set the timeout, for the message of a silent monitor


def get_from_monitor(monitor: str, path: str, params: dict, ask: Ask):
    """``GET monitor+path`` with the run's token, certificate check and timeout: the response
    (any status but 401/403), or the MonitorFailure of a monitor that gave none or refused."""
    from hangwatch_common.http_client import httpx

    headers = {"authorization": f"Bearer {ask.access.token}"} if ask.access.token else {}
    try:
        r = httpx.get(monitor + path, params=params, headers=headers, verify=ask.access.verify, timeout=ask.timeout)
    except httpx.TimeoutException:
        raise NoAnswer(monitor, ask.timeout, ask.timeout_named) from None
    except httpx.HTTPError as e:
        raise Unreachable(monitor, e) from None
    if r.status_code in (401, 403):
        raise Refused(monitor, r.status_code, ask.access)
    return r


def _answer(monitor: str, ask: Ask) -> dict:
    """The monitor's one answer, ``GET /diagnose?format=json``: its jobs (every field the text
    report needs) and its own status. ``?job=`` of a job it does not hold answers 404 with an
    answer of no jobs (and ``job`` echoing the id): that is an answer. Raises a MonitorFailure."""
    r = get_from_monitor(monitor, "/diagnose", {"format": "json", **({"job": ask.job} if ask.job else {})}, ask)
    if r.status_code == 404:
        answer = _no_such_job(r, ask.job)
        if answer is None:
            raise NotFound(monitor)
        return answer
    if not r.is_success:
        raise MonitorFailure(monitor, f"answered HTTP {r.status_code} {r.reason_phrase}{_base_url_hint(monitor)}")
    try:
        answer = r.json()
    except ValueError:  # not JSON, so not a monitor
        raise Unreadable(monitor, "not JSON") from None
    if not _readable(answer):
        raise Unreadable(monitor, "not a /diagnose answer with jobs that each have a job_id and a verdict")
    return answer


def _no_such_job(response, job: str | None) -> dict | None:
    """A monitor's 404 for ``?job=`` naming a job it does not hold, as its answer (no jobs);
    None for any other 404 (a wrong path: FastAPI's ``{"detail": "Not Found"}``, a proxy's page)."""
    if job is None:
        return None
    try:
        answer = response.json()
    except ValueError:
        return None
    if isinstance(answer, dict) and answer.get("job") == job and answer.get("jobs") == []:
        return answer
    return None


def _readable(answer: object) -> bool:
    """The shape every command relies on: jobs that each have an id and a verdict."""
    jobs = answer.get("jobs", []) if isinstance(answer, dict) else None
    return isinstance(jobs, list) and all(
        isinstance(j, dict) and isinstance(j.get("job_id"), str) and isinstance(j.get("verdict"), str) for j in jobs)


@dataclass
class Answers:
    """What each monitor said: ``answered`` in the order the monitors were given, and the ones
    that did not answer, each with why."""

    monitors: list[str]
    answered: dict[str, dict]
    failed: dict[str, MonitorFailure]


# Past the timeout a monitor's own timeout error has this long to land before it is called silent.
TIMEOUT_GRACE_S = 0.25


def ask_monitors(ask: Ask) -> Answers:
    """Every monitor asked at once, each in a thread of its own (sharded monitors each hold a
    share, and one silent monitor must not hold up the others' answers): the answers within
    ``ask.timeout``, and why each other monitor gave none. The threads are daemons: one stuck
    in a silent monitor's read past the deadline does not keep this command from exiting."""
    got: dict[str, dict | MonitorFailure] = {}
    lock = threading.Lock()

    def ask_one(monitor: str) -> None:
        try:
            result: dict | MonitorFailure = _answer(monitor, ask)
        except MonitorFailure as e:
            result = e
        except Exception as e:  # noqa: BLE001 - any other failure is this monitor's, one line, no traceback
            result = Unreachable(monitor, e)
        with lock:
            got[monitor] = result

    threads = [threading.Thread(target=ask_one, args=(m,), name=f"hangwatch ask {m}", daemon=True) for m in ask.monitors]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + ask.timeout + TIMEOUT_GRACE_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        results = dict(got)
    answers = Answers(ask.monitors, {}, {})
    for m in ask.monitors:
        result = results.get(m) or NoAnswer(m, ask.timeout, ask.timeout_named)
        if isinstance(result, MonitorFailure):
            answers.failed[m] = result
        else:
            answers.answered[m] = result
    return answers
