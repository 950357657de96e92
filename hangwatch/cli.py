"""The ``hangwatch`` command: a live demo, and /diagnose for a person at a terminal.

    hangwatch demo deadlock|straggler|exit|slow|stopped|killed|collective|ddp|async|rendezvous|finish [--linger [S]]
    hangwatch diagnose [--monitor URL ...] [--json] [--job ID] [--token-file PATH] [--ca-file PATH]
    hangwatch status [--monitor URL ...] [--job ID] [--token-file PATH] [--ca-file PATH]
    hangwatch --version

Exit codes of ``diagnose`` and ``status`` (also in their --help):

    0  every job is healthy or finished (or there is no job at all)
    1  a job has any other verdict: hung, stopped, a rank gone, a straggler...
    2  a monitor cannot be reached or refuses the request, or bad options
    3  --job names a job that no monitor knows

Each asks each monitor once (``/diagnose?format=json``); ``diagnose`` writes its text report
from that answer. With monitors sharded by job id (docs/scaling.md), give every one: their jobs
are shown together. ``status`` is a table, one row per job (hangwatch/status_table.py).

``demo`` prints the monitor's status page URL as soon as the monitor is up; ``--linger``
keeps the monitor, its page and the stalled job up after the verdicts, until Ctrl-C or for
the seconds given.

A monitor started with --read-token-file wants a read token: ``--token-file`` (default
$HANGWATCH_READ_TOKEN_FILE) names a file holding it, with the agent's rules
(hangwatch_common/token_file.py: one token, mode 600), sent as ``Authorization: Bearer``. Never on the
command line, never printed. ``--ca-file`` (default $HANGWATCH_CA_FILE) is the CA bundle that
verifies an https monitor's certificate.

What the monitor answers is printed with its control characters escaped (hangwatch_common/safe_text.py):
job ids, frames and log lines come from the monitored processes, and only the colour codes
this command adds itself reach the terminal as they are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_MONITOR = "http://127.0.0.1:8787"
OK_VERDICTS = ("healthy", "finished")
EXIT_OK, EXIT_ALARM, EXIT_UNREACHABLE, EXIT_UNKNOWN_JOB = 0, 1, 2, 3
EXIT_CODES = f"""exit codes:
  {EXIT_OK}  every job is healthy or finished (or there is no job at all)
  {EXIT_ALARM}  a job has any other verdict: hung, stopped, a rank gone, a straggler...
  {EXIT_UNREACHABLE}  a monitor cannot be reached or refuses the request, or bad options
  {EXIT_UNKNOWN_JOB}  --job names a job that no monitor knows
"""


def _url(text: str) -> str:
    u = urlparse(text)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text.rstrip("/")


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not v >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return v


from hangwatch_common.cli_common import (  # noqa: E402
    OneLineParser,
    UsageError,
    add_access_options,
    add_version_option,
    given_by,
    tls_verify,
)
from hangwatch.demo.cases import CASE_NAMES, demo_cases  # noqa: E402
from hangwatch.colour import paint_verdict, paint_verdicts_in, wants_colour  # noqa: E402
from hangwatch.demo.harness import watch_case  # noqa: E402
from hangwatch.status_table import render_table  # noqa: E402
from hangwatch_common.safe_text import one_line, text_block  # noqa: E402


def _say(t0: float, msg: str) -> None:
    print(f"[+{time.monotonic() - t0:5.1f}s] {one_line(msg)}", flush=True)


def run_demo(case_name: str, *, timeout: float, linger: float, stall_step: int, workdir: str | None) -> int:
    from hangwatch.demo.cases import launch_case  # imported here: `hangwatch diagnose` needs none of this
    from hangwatch.demo.harness import MonitorClient, Reaper, kill_pid, start_agent, start_monitor, stop_gently

    case = demo_cases(stall_step)[case_name]
    tmp = tempfile.TemporaryDirectory(prefix="hangwatch-demo-") if workdir is None else None
    wd = Path(tmp.name if tmp else workdir)
    wd.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    reaper = Reaper()
    client = None
    orphan = None
    services = []
    found = False
    try:
        monitor = start_monitor(reaper, wd)
        services.append(monitor)
        _say(t0, f"monitor on {monitor.url} (db {wd / 'monitor.db'})")
        _say(t0, f"status page: {monitor.url}/ (open it to watch the job go wrong)")
        agent = start_agent(reaper, wd, monitor.url, interval=1.0)
        services.append(agent)
        _say(t0, f"agent pid {agent.proc.pid}, sampling every 1 s")
        job = launch_case(case, reaper, wd)
        orphan = job.orphan_pid
        if orphan:
            _say(t0, f"an orphan (PPID 1) python, pid {orphan}, holds the master port {job.job_id}")
        if case.launcher == "plain":
            _say(t0, f"started {case.nranks} ranks directly with WORLD_SIZE={case.world_size}: job {job.job_id}")
        else:
            _say(t0, f"started torchrun --nproc-per-node={case.nranks}: job {job.job_id}")
        _say(t0, f"what goes wrong: {case.what}")
        _say(t0, f"job output: {', '.join(str(p) for p in job.logs)}")
        expected = case.expect + (f" (culprits {list(case.culprits)})" if case.culprits else "")
        _say(t0, f"expected verdict: {expected}")
        client = MonitorClient(monitor.url)

        def on_event(kind: str, payload) -> None:
            if kind == "signal":
                _say(t0, f"sent {signal.Signals(case.signal).name} to rank 1 (pid {payload})")
            elif kind == "stall":
                what = "the job has ended" if case.expect == "finished" else "the workload reports the failure started"
                _say(t0, what)
            elif kind == "change":
                culprits = payload.get("culprit_ranks") or []
                _say(t0, f"verdict now: {payload['verdict']}" + (f" culprits {culprits}" if culprits else ""))
                print(_indent(text_block(client.diagnose_text(job.job_id))), flush=True)
            elif kind == "detected":
                _say(t0, "the monitor shows the expected verdict")
            elif kind == "timeout":
                _say(t0, f"gave up after {timeout:.0f}s without the expected verdict {expected}")

        run = watch_case(case, job, client, stall_step=stall_step, timeout=timeout, poll=0.5, on_event=on_event)
        found = run.detected is not None
        if case.quiet:
            _say(t0, f"{'no' if found else 'a'} false alarm in the {case.quiet:.0f}s window")
        elif run.detection_seconds is not None:
            _say(t0, f"detected {run.detection_seconds:.1f}s after the failure began")
        _say(t0, "final /diagnose:")
        print(_indent(text_block(client.diagnose_text(job.job_id))), flush=True)
        if linger > 0:
            _linger(t0, monitor.url, linger)
    except KeyboardInterrupt:
        _say(t0, "interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - one line for a person, not a traceback
        print(f"hangwatch demo: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
        if orphan:
            kill_pid(orphan)
        for svc in services:  # a clean stop for the monitor and agent, then kill whatever is left
            stop_gently(svc.proc, timeout=3)
        reaper.close()
        if tmp is not None:
            tmp.cleanup()
        _say(t0, "cleaned up: every process the demo started is gone")
    return 0 if found else 1


def _linger(t0: float, url: str, seconds: float) -> None:
    """Keep everything up (the job stays stalled, the monitor keeps diagnosing it) for a person
    at the status page, until the time is over or Ctrl-C, which here ends the demo as usual."""
    how_long = "until Ctrl-C" if math.isinf(seconds) else f"for {seconds:g}s (Ctrl-C ends it sooner)"
    _say(t0, f"lingering {how_long}: the status page {url}/ stays up")
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            time.sleep(max(0.0, min(1.0, end - time.monotonic())))
    except KeyboardInterrupt:
        _say(t0, "Ctrl-C: ending the demo")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines())


# ---------------------------------------------------------------- diagnose / status


@dataclass(frozen=True)
class Access:
    """What every request to the monitors carries: the read token (and the file it came from),
    and what verifies an https monitor's certificate (httpx's ``verify``)."""

    token: str | None = None
    token_file: str | None = None
    verify: ssl.SSLContext | bool = True


def _access(args) -> Access:
    """From --token-file/--ca-file or their variables (an empty one is as good as unset);
    an unusable file is a UsageError naming it (never the token)."""
    from hangwatch_common.token_file import TokenFileError, read_token

    token_file = args.token_file or os.environ.get("HANGWATCH_READ_TOKEN_FILE") or None
    ca_file = args.ca_file or os.environ.get("HANGWATCH_CA_FILE") or None
    token = None
    if token_file:
        try:
            token, _ = read_token(token_file)
        except TokenFileError as e:
            raise UsageError(f"{given_by('--token-file', 'HANGWATCH_READ_TOKEN_FILE', args.token_file)}: {e}") \
                from None
    verify = tls_verify(ca_file, given_by("--ca-file", "HANGWATCH_CA_FILE", args.ca_file))
    return Access(token, token_file, verify)


class Unreadable(Exception):
    """A monitor answered, but not what this hangwatch reads (another version, or not a monitor)."""

    def __init__(self, monitor: str, why: str) -> None:
        super().__init__(f"monitor {monitor} answered something this hangwatch cannot read: {why}")


class Unreachable(Exception):
    def __init__(self, monitor: str, error: Exception) -> None:
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in str(error):
            hint = " -- its certificate is not trusted: --ca-file names the CA bundle that signed it"
        super().__init__(f"monitor {monitor} unreachable: {error or type(error).__name__}{hint}")
        self.monitor = monitor


class Refused(Exception):
    """401/403: the monitor wants a read token, or not this one."""

    def __init__(self, monitor: str, status: int, access: Access) -> None:
        if access.token is None:
            why = "it wants a read token: pass --token-file PATH (or set HANGWATCH_READ_TOKEN_FILE)"
        else:
            why = (f"it refused the read token in {access.token_file}: pass --token-file with one of the "
                   "tokens of the monitor's --read-token-file")
        super().__init__(f"monitor {monitor} answered HTTP {status}: {why}")


def _answer(monitor: str, job: str | None, access: Access) -> dict:
    """The monitor's one answer, ``GET /diagnose?format=json``: its jobs (every field the text
    report needs) and its own status. Raises Refused on 401/403, Unreachable on any other failure."""
    import httpx

    headers = {"authorization": f"Bearer {access.token}"} if access.token else {}
    params = {"format": "json", **({"job": job} if job else {})}
    try:
        r = httpx.get(monitor + "/diagnose", params=params, headers=headers, verify=access.verify, timeout=10.0)
        if r.status_code in (401, 403):
            raise Refused(monitor, r.status_code, access)
        r.raise_for_status()
        answer = r.json()
    except (httpx.HTTPError, ValueError) as e:  # ValueError: not JSON, so not a monitor
        raise Unreachable(monitor, e) from None
    if not _readable(answer):
        raise Unreadable(monitor, "not a /diagnose answer with jobs that each have a job_id and a verdict")
    return answer


def _readable(answer: object) -> bool:
    """The shape every command relies on: jobs that each have an id and a verdict."""
    jobs = answer.get("jobs", []) if isinstance(answer, dict) else None
    return isinstance(jobs, list) and all(
        isinstance(j, dict) and isinstance(j.get("job_id"), str) and isinstance(j.get("verdict"), str) for j in jobs)


def _answers(monitors: list[str], job: str | None, access: Access) -> dict[str, dict]:
    """Each monitor's answer (sharded monitors each hold a share); raises Unreachable or Refused for any."""
    return {m: _answer(m, job, access) for m in monitors}


def _merged(answers: dict[str, dict]) -> list[tuple[dict, str]]:
    """Every job with the monitor that holds it."""
    jobs = [(j, m) for m, answer in answers.items() for j in answer.get("jobs", [])]
    if len(answers) > 1:  # each answer is most recently active first: keep that across monitors
        jobs.sort(key=lambda jm: -(jm[0].get("last_report_at") or 0.0))
    return jobs


def _exit_code(jobs: list[dict]) -> int:
    return EXIT_ALARM if any(j.get("verdict") not in OK_VERDICTS for j in jobs) else EXIT_OK


def _report_text(answer: dict) -> str:
    """What the monitor's own text /diagnose says, written here from its JSON answer."""
    from monitor.render_text import render_job, render_monitor_status, render_text

    jobs = answer.get("jobs", [])
    body = "\n".join(render_job(j, j.get("now") or time.time()) for j in jobs) if jobs else render_text([], 0.0)
    return render_monitor_status(answer.get("monitor") or {}) + body


# What rendering an answer of an unexpected shape raises (a monitor of another version).
RENDER_ERRORS = (KeyError, TypeError, ValueError, AttributeError)


def _fail(error: Exception) -> int:
    print(f"hangwatch: {one_line(str(error))}", file=sys.stderr)
    return EXIT_UNREACHABLE


def _unknown_job(args, monitors: list[str]) -> int:
    print(f"hangwatch: no job {one_line(args.job)!r} at {', '.join(monitors)}", file=sys.stderr)
    return EXIT_UNKNOWN_JOB


def cmd_diagnose(args, access: Access) -> int:
    monitors = _monitors(args)
    try:
        answers = _answers(monitors, args.job, access)
    except (Unreachable, Unreadable, Refused) as e:
        return _fail(e)
    jobs = [j for j, _ in _merged(answers)]
    if args.job and not jobs:
        return _unknown_job(args, monitors)
    if args.json:
        print(json.dumps({"jobs": jobs}, indent=2))
    else:
        # The monitors that hold jobs (or the only one, which then says it has none).
        shown = [a for a in answers.values() if a.get("jobs")] or list(answers.values())[:1]
        try:
            text = text_block("\n".join(_report_text(a) for a in shown))
        except RENDER_ERRORS as e:
            # A monitor of another version, or a broken answer: say so, never a traceback (exit 1 would read as an alarm).
            return _fail(Unreadable(", ".join(monitors), f"its jobs cannot be written as text ({e!r})"))
        sys.stdout.write(paint_verdicts_in(text, wants_colour(sys.stdout, args.color)))
    return _exit_code(jobs)


def _monitors(args) -> list[str]:
    return list(dict.fromkeys(args.monitor or [args.default_monitor]))


def cmd_status(args, access: Access) -> int:
    monitors = _monitors(args)
    try:
        answers = _answers(monitors, args.job, access)
    except (Unreachable, Unreadable, Refused) as e:
        return _fail(e)
    jobs = _merged(answers)
    if args.job and not jobs:
        return _unknown_job(args, monitors)
    from monitor.render_text import render_monitor_status

    colour = wants_colour(sys.stdout, args.color)
    try:
        out = []
        for monitor, answer in answers.items():  # a monitor past capacity or not storing says so first
            for line in text_block(render_monitor_status(answer.get("monitor") or {})).splitlines():
                if line:
                    out.append(f"{line} ({monitor})" if len(monitors) > 1 else line)
        rows = [(j, m if len(monitors) > 1 else None) for j, m in jobs]
        table = render_table(rows, lambda text, verdict: paint_verdict(text, verdict, colour)) if jobs else "no jobs\n"
    except RENDER_ERRORS as e:
        return _fail(Unreadable(", ".join(monitors), f"its jobs cannot be shown as a table ({e!r})"))
    sys.stdout.write("".join(line + "\n" for line in out) + table)
    return _exit_code([j for j, _ in jobs])


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hangwatch", description="hangwatch: live hang detection for distributed PyTorch training")
    add_version_option(p)
    p.set_defaults(default_monitor=os.environ.get("HANGWATCH_MONITOR", DEFAULT_MONITOR))
    sub = p.add_subparsers(dest="command", parser_class=OneLineParser)

    d = sub.add_parser("demo", help="a real 2-rank gloo job that goes wrong, diagnosed live")
    d.add_argument("case", choices=CASE_NAMES, metavar="CASE", help=" | ".join(CASE_NAMES))
    d.add_argument("--timeout", type=_positive, default=90.0,
                   help="give up after this many seconds without the expected verdict (default 90)")
    d.add_argument("--linger", type=_seconds, nargs="?", const=math.inf, default=0.0, metavar="SECONDS",
                   help="after the verdicts, keep the monitor, its status page and the stalled job up for "
                        "this many seconds, or until Ctrl-C when no number is given (default: end at once)")
    d.add_argument("--stall-step", type=int, default=40, help="the step at which things go wrong (default 40)")
    d.add_argument("--workdir", default=None, help="keep the job logs and the monitor db here")

    monitor_help = (f"monitor URL (default $HANGWATCH_MONITOR or {DEFAULT_MONITOR}); repeat for monitors "
                    "sharded by job id")

    def add_access(cmd: argparse.ArgumentParser) -> None:
        add_access_options(cmd, "file holding the monitor's read token (mode 600), for a monitor started with "
                                "--read-token-file; default: $HANGWATCH_READ_TOKEN_FILE")

    g = sub.add_parser("diagnose", help="print the monitor's /diagnose", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--monitor", type=_url, action="append", help=monitor_help)
    g.add_argument("--json", action="store_true", help="JSON instead of text")
    g.add_argument("--job", default=None, help="only this job id")
    g.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the verdicts: auto = only on a terminal (default)")
    add_access(g)

    s = sub.add_parser("status", help="a table, one row per job", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--monitor", type=_url, action="append", help=monitor_help)
    s.add_argument("--job", default=None, help="only this job id")
    s.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the verdicts: auto = only on a terminal (default)")
    add_access(s)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # e.g. `hangwatch diagnose --json | head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 0


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        print(f"hangwatch: error: {e}", file=sys.stderr)
        return 2
    if args.command is None:
        print("hangwatch: error: a command is required: demo, diagnose or status (see hangwatch --help)",
              file=sys.stderr)
        return 2
    if args.command == "demo":
        if args.stall_step < 2:
            print("hangwatch: error: --stall-step must be at least 2", file=sys.stderr)
            return 2
        return run_demo(args.case, timeout=args.timeout, linger=args.linger,
                        stall_step=args.stall_step, workdir=args.workdir)
    try:
        access = _access(args)
    except UsageError as e:
        print(f"hangwatch: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    if args.command == "diagnose":
        return cmd_diagnose(args, access)
    return cmd_status(args, access)


if __name__ == "__main__":
    sys.exit(main())
