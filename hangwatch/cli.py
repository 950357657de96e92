"""The ``hangwatch`` command: a live demo, and /diagnose for a person at a terminal.

    hangwatch demo deadlock|straggler|exit|slow|stopped|killed|collective|ddp|async|rendezvous|finish
                   [--linger [S]] [--port PORT]
    hangwatch diagnose [--monitor URL ...] [--json] [--job ID] [--timeout S] [--token-file PATH] [--ca-file PATH]
    hangwatch status [--monitor URL ...] [--job ID] [--timeout S] [--token-file PATH] [--ca-file PATH]
    hangwatch --version

Exit codes of ``diagnose`` and ``status`` (also in their --help):

    0  every job is healthy or finished (or there is no job at all)
    1  a job has any other verdict: hung, stopped, a rank gone, a straggler...
    2  a monitor cannot be reached, is silent past --timeout or refuses the request (the jobs
       of those that answered are all healthy or finished), or bad options
    3  --job names a job that no monitor knows (every monitor answered)
    4  both 1 and 2: a job in alarm on a monitor that answered, and a monitor that did not

Each asks every monitor once (``/diagnose?format=json``), all at once, each in a thread of its
own (hangwatch/monitor_client.py), and waits --timeout (default $HANGWATCH_TIMEOUT_S or 10 s) for
them; ``diagnose`` writes its text report from those answers. With monitors sharded by job id
(docs/scaling.md), give every one: their jobs are shown together, and each monitor that did not
answer is named on stderr, one line each with why, so one monitor down neither hides another's
alarm nor is hidden by its healthy jobs. ``status`` is a table, one row per job
(hangwatch/status_table.py).

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
import shlex
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from monitor.diagnosis.verdict_catalogue import QUIET

DEFAULT_MONITOR = "http://127.0.0.1:8787"
OK_VERDICTS = QUIET  # healthy, finished: exit 0
EXIT_OK, EXIT_ALARM, EXIT_UNREACHABLE, EXIT_UNKNOWN_JOB, EXIT_ALARM_UNREACHABLE = 0, 1, 2, 3, 4
EXIT_CODES = f"""exit codes:
  {EXIT_OK}  every job is healthy or finished (or there is no job at all)
  {EXIT_ALARM}  a job has any other verdict: hung, stopped, a rank gone, a straggler...
  {EXIT_UNREACHABLE}  a monitor cannot be reached, is silent past --timeout or refuses the request
     (the jobs of those that answered are all healthy or finished), or bad options
  {EXIT_UNKNOWN_JOB}  --job names a job that no monitor knows (every monitor answered)
  {EXIT_ALARM_UNREACHABLE}  both {EXIT_ALARM} and {EXIT_UNREACHABLE}: a job in alarm on a monitor that answered, and a monitor
     that did not answer
What answered is shown; each monitor that did not is named on stderr, with why.
"""
# How long each monitor gets to answer (they are asked at once) unless --timeout or this says otherwise.
DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_VARIABLE = "HANGWATCH_TIMEOUT_S"


def _url(text: str) -> str:
    u = urlparse(text)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    if u.query or u.fragment:  # the commands add /diagnose?format=json to the base URL
        raise argparse.ArgumentTypeError(f"{text!r} is not a base URL: give the monitor's base URL: "
                                         f"{u.scheme}://{u.netloc}")
    return text.rstrip("/")


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return v


def _duration(text: str) -> float:
    """Seconds, or a number with a unit: 90s, 30m, 12h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    scale = units.get(text[-1:].lower(), None)
    number = text[:-1] if scale is not None else text
    try:
        v = float(number) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration (seconds, or a number with s, m, h or d): {text!r}") \
            from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return v


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (1-65535): {text!r}")
    return v


def _port_free(port: int) -> bool:
    with socket.socket() as s:  # as the monitor binds it (uvicorn sets SO_REUSEADDR)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
from hangwatch.monitor_client import Access, Answers, Ask, MonitorFailure, Unreadable, ask_monitors  # noqa: E402
from hangwatch import nodes_command  # noqa: E402
from hangwatch.status_table import render_table  # noqa: E402
from hangwatch_common.safe_text import one_line, text_block  # noqa: E402


def _say(t0: float, msg: str) -> None:
    print(f"[+{time.monotonic() - t0:5.1f}s] {one_line(msg)}", flush=True)


def run_demo(case_name: str, *, timeout: float, linger: float, stall_step: int, workdir: str | None,
             port: int | None = None) -> int:
    from hangwatch.demo.cases import launch_case  # imported here: `hangwatch diagnose` needs none of this
    from hangwatch.demo.harness import (MonitorClient, Reaper, kill_pid, start_agent, start_monitor, stop_gently,
                                        watch_case)

    # Ctrl-C ends the demo (and cleans up) even when it was started with SIGINT ignored, as a shell
    # starts background commands and some test runners their workers: Python then installs no handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
    ended = False  # the run went through (verdict or not), so the next commands are worth printing
    try:
        monitor = start_monitor(reaper, wd, port=port)
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
            elif kind == "change" and not payload.get("ranks"):
                # Only the launcher so far: no verdict worth reading about ranks that have not started.
                _say(t0, "the launcher is seen; waiting for its ranks to start")
            elif kind == "change":
                culprits = payload.get("culprit_ranks") or []
                _say(t0, f"verdict now: {payload['verdict']}" + (f" culprits {culprits}" if culprits else ""))
                print(_indent(text_block(client.diagnose_text(job.job_id))), flush=True)
            elif kind == "detected":
                _say(t0, "the monitor shows the expected verdict")
            elif kind == "timeout":
                _say(t0, f"gave up after {timeout:.0f}s without the expected verdict {expected}")

        run = watch_case(case, job, client, stall_step=stall_step, timeout=timeout + case.extra_time_s, poll=0.5,
                         on_event=on_event)
        found = run.detected is not None
        if case.quiet:
            _say(t0, f"{'no' if found else 'a'} false alarm in the {case.quiet:.0f}s window")
        elif run.detection_seconds is not None:
            _say(t0, f"detected {run.detection_seconds:.1f}s after the failure began")
        _say(t0, "final /diagnose:")
        print(_indent(text_block(client.diagnose_text(job.job_id))), flush=True)
        if linger > 0:
            _linger(t0, monitor.url, linger)
        ended = True
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
    if ended and linger == 0:
        # The monitor is gone: the same demo again, kept up on the same port, makes the commands work.
        _say(t0, "next: run the demo again with its monitor kept up (until Ctrl-C), and from another "
                 "terminal ask the monitor yourself:")
        again = f"{_hangwatch_command()} demo {case_name} --linger --port {_port_of(monitor.url)}"
        print(_indent("\n".join([again, *next_commands(monitor.url)])), flush=True)
    return 0 if found else 1


def _hangwatch_command() -> str:
    """How a person runs this very ``hangwatch`` from any directory: the absolute path of the
    console script beside this Python (a venv's bin/, which need not be on PATH)."""
    here = Path(sys.executable).with_name("hangwatch")
    if here.exists():
        return shlex.quote(str(here.absolute()))
    return f"{shlex.quote(str(Path(sys.executable).absolute()))} -m hangwatch.cli"


def next_commands(url: str) -> list[str]:
    """Copy-pasteable commands that ask the monitor at ``url``, as a person would next."""
    hangwatch = _hangwatch_command()
    env = f"HANGWATCH_MONITOR={shlex.quote(url)}"
    return [f"{env} {hangwatch} diagnose", f"{env} {hangwatch} status", f"curl -s {shlex.quote(url + '/diagnose')}"]


def _port_of(url: str) -> int:
    return urlparse(url).port or 80


def _linger(t0: float, url: str, seconds: float) -> None:
    """Keep everything up (the job stays stalled, the monitor keeps diagnosing it) for a person
    at the status page, until the time is over or Ctrl-C, which here ends the demo as usual."""
    how_long = "until Ctrl-C" if math.isinf(seconds) else f"for {seconds:g}s (Ctrl-C ends it sooner)"
    _say(t0, f"lingering {how_long}: the status page {url}/ stays up")
    _say(t0, "ask the demo's monitor yourself, from another terminal, while it lingers:")
    print(_indent("\n".join(next_commands(url))), flush=True)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            time.sleep(max(0.0, min(1.0, end - time.monotonic())))
    except KeyboardInterrupt:
        _say(t0, "Ctrl-C: ending the demo")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines())


# ---------------------------------------------------------------- diagnose / status



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


def _merged(answers: Answers) -> list[tuple[dict, str]]:
    """Every job with the monitor that holds it."""
    jobs = [(j, m) for m, answer in answers.answered.items() for j in answer.get("jobs", [])]
    if len(answers.answered) > 1:  # each answer is most recently active first: keep that across monitors
        jobs.sort(key=lambda jm: -_report_time(jm[0]))
    return jobs


def _job_list(answer: dict) -> None:
    """Raises TypeError unless the answer is a monitor's list of jobs (objects)."""
    if not isinstance(answer, dict) or not all(isinstance(j, dict) for j in answer.get("jobs", [])):
        raise TypeError("not a list of jobs")


def _report_time(job: dict) -> float:
    try:
        return float(job.get("last_report_at") or 0.0)
    except (TypeError, ValueError, OverflowError):  # another version's answer: last
        return 0.0


def _exit_code(jobs: list[dict], answers: Answers, job: str | None) -> int:
    """One code for both what the answers say and whether every monitor answered: an alarm is
    never hidden by a monitor that did not answer, nor a monitor that did not answer by healthy
    answers (EXIT_ALARM_UNREACHABLE says both). An unknown --job is unknown only when every
    monitor answered: a silent one may hold it."""
    alarm = any(j.get("verdict") not in OK_VERDICTS for j in jobs)
    if answers.failed:
        return EXIT_ALARM_UNREACHABLE if alarm else EXIT_UNREACHABLE
    if job and not jobs:
        return EXIT_UNKNOWN_JOB
    return EXIT_ALARM if alarm else EXIT_OK


def _report_text(answer: dict) -> str:
    """What the monitor's own text /diagnose says, written here from its JSON answer."""
    from monitor.present.render_text import render_job, render_monitor_status, render_text

    jobs = answer.get("jobs", [])
    body = "\n".join(render_job(j, j.get("now") or time.time()) for j in jobs) if jobs else render_text([], 0.0)
    return render_monitor_status(answer.get("monitor") or {}) + body


# What rendering an answer of an unexpected shape raises (a monitor of another version).
RENDER_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError)


def _say_failures(answers: Answers, job: str | None, jobs: list) -> None:
    """One line on stderr for each monitor that did not answer, with why; and, for a --job that
    no answering monitor knows, which ones were asked."""
    for failure in answers.failed.values():
        print(f"hangwatch: {one_line(str(failure))}", file=sys.stderr)
    if job and not jobs and answers.answered:
        print(f"hangwatch: no job {one_line(job)!r} at {', '.join(answers.answered)}", file=sys.stderr)


def _set_aside_unreadable(answers: Answers, render: Callable[[dict], object], what: str) -> None:
    """Move each answer ``render`` cannot read to the failures: one monitor of another version (or
    not a monitor) must not hide what the others say; it is named on stderr and the exit code
    says a monitor gave no usable answer."""
    for monitor, answer in list(answers.answered.items()):
        try:
            render(answer)
        except RENDER_ERRORS as e:
            del answers.answered[monitor]
            answers.failed[monitor] = Unreadable(monitor, f"its jobs cannot be {what} ({e!r})")


def _unreadable(answers: Answers, what: str, error: Exception) -> int:
    # A monitor of another version, or a broken answer: say so, never a traceback (exit 1 would read as an alarm).
    # Which of the answers it was is not known here: all that answered are named (and no base-URL hint).
    failure = MonitorFailure(", ".join(answers.answered),
                             f"answered something this hangwatch cannot read: its jobs cannot be {what} ({error!r})")
    print(f"hangwatch: {one_line(str(failure))}", file=sys.stderr)
    return EXIT_UNREACHABLE


def cmd_diagnose(args, ask: Ask) -> int:
    answers = ask_monitors(ask)
    _set_aside_unreadable(answers, _job_list if args.json else _report_text, "listed" if args.json else "written as text")
    jobs = [j for j, _ in _merged(answers)]
    if args.json:
        unanswered = [{"monitor": m, "error": str(f)} for m, f in answers.failed.items()]
        print(json.dumps({"jobs": jobs, "unanswered": unanswered}, indent=2))
    elif answers.answered and (jobs or not ask.job):
        # The monitors that hold jobs (or the first that answered, which then says it has none).
        shown = [a for a in answers.answered.values() if a.get("jobs")] or list(answers.answered.values())[:1]
        try:
            text = text_block("\n".join(_report_text(a) for a in shown))
        except RENDER_ERRORS as e:
            return _unreadable(answers, "written as text", e)
        sys.stdout.write(paint_verdicts_in(text, wants_colour(sys.stdout, args.color)))
    _say_failures(answers, ask.job, jobs)
    return _exit_code(jobs, answers, ask.job)


def cmd_status(args, ask: Ask) -> int:
    from monitor.present.render_text import render_monitor_status

    answers = ask_monitors(ask)
    _set_aside_unreadable(answers, lambda answer: (
        render_monitor_status(answer.get("monitor") or {}),
        render_table([(j, None) for j in answer.get("jobs", [])], lambda text, verdict: text)), "shown as a table")
    jobs = _merged(answers)
    if answers.answered and (jobs or not ask.job):
        colour = wants_colour(sys.stdout, args.color)
        several = len(answers.monitors) > 1
        try:
            out = []
            for monitor, answer in answers.answered.items():  # a monitor past capacity or not storing says so first
                for line in text_block(render_monitor_status(answer.get("monitor") or {})).splitlines():
                    if line:
                        out.append(f"{line} ({monitor})" if several else line)
            rows = [(j, m if several else None) for j, m in jobs]
            if jobs:
                table = render_table(rows, lambda text, verdict: paint_verdict(text, verdict, colour))
            elif answers.failed:
                table = f"no jobs at the {len(answers.answered)} of {len(answers.monitors)} monitors that answered\n"
            else:
                table = "no jobs\n"
        except RENDER_ERRORS as e:
            return _unreadable(answers, "shown as a table", e)
        sys.stdout.write("".join(line + "\n" for line in out) + table)
        sys.stdout.flush()
    _say_failures(answers, ask.job, jobs)
    return _exit_code([j for j, _ in jobs], answers, ask.job)


def cmd_nodes(args, ask: Ask) -> int:
    """0: every monitor answered; 2 (as for diagnose): one or more did not (each named on stderr)."""
    answers, failed = [], []
    for monitor in ask.monitors:
        try:
            answers.append(nodes_command.fetch_suspects(monitor, ask, args.window))
        except MonitorFailure as e:
            failed.append(e)
    nodes = nodes_command.merge(answers)
    if args.json:
        print(json.dumps({"window_s": args.window, "nodes": nodes,
                          "unanswered": [{"monitor": f.monitor, "error": str(f)} for f in failed]}, indent=2))
    elif answers:
        sys.stdout.write(nodes_command.render(nodes, args.window, time.time()))
    for failure in failed:
        print(f"hangwatch: {one_line(str(failure))}", file=sys.stderr)
    return EXIT_UNREACHABLE if failed else EXIT_OK


def _monitors(args) -> list[str]:
    """--monitor URLs in the order given (each once), else $HANGWATCH_MONITOR, else the default."""
    if args.monitor:
        return list(dict.fromkeys(args.monitor))
    from_env = os.environ.get("HANGWATCH_MONITOR") or None  # empty: as good as unset
    try:
        return [_url(from_env or DEFAULT_MONITOR)]
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"HANGWATCH_MONITOR: {e}") from None


def _timeout(args) -> tuple[float, str]:
    """Seconds each monitor gets, and what set it (for the message of a silent monitor)."""
    if args.timeout is not None:
        return args.timeout, "--timeout"
    from_env = os.environ.get(TIMEOUT_VARIABLE) or None
    if from_env is None:
        return DEFAULT_TIMEOUT_S, "--timeout"
    try:
        return _positive(from_env), TIMEOUT_VARIABLE
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"{TIMEOUT_VARIABLE}: {e}") from None


def _ask(args) -> Ask:
    """The validated settings of diagnose/status; raises UsageError naming the bad one."""
    monitors = _monitors(args)
    timeout, named = _timeout(args)
    return Ask(monitors, args.job, _access(args), timeout, named)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hangwatch", description="hangwatch: live hang detection for distributed PyTorch training")
    add_version_option(p)
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
    d.add_argument("--port", type=_port, default=None,
                   help="the monitor's port on 127.0.0.1 (default: a free one)")

    monitor_help = (f"monitor's base URL (default $HANGWATCH_MONITOR or {DEFAULT_MONITOR}); repeat for monitors "
                    "sharded by job id: all are asked at once")

    def add_access(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--timeout", type=_positive, default=None, metavar="SECONDS",
                         help=f"how long each monitor gets to answer (default ${TIMEOUT_VARIABLE} or "
                              f"{DEFAULT_TIMEOUT_S:g})")
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

    n = sub.add_parser("nodes", help="the nodes named as culprits in incidents of the most distinct jobs: "
                                     "drain candidates")
    n.add_argument("--monitor", type=_url, action="append", help=monitor_help)
    n.add_argument("--window", type=_duration, default=7 * 86400.0, metavar="DURATION",
                   help="how far back incidents count: seconds, or 90m, 12h, 7d (default 7d)")
    n.add_argument("--json", action="store_true", help="JSON instead of a table")
    n.set_defaults(job=None)
    add_access(n)
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
        print("hangwatch: error: a command is required: demo, diagnose, status or nodes (see hangwatch --help)",
              file=sys.stderr)
        return 2
    if args.command == "demo":
        if args.stall_step < 2:
            print("hangwatch: error: --stall-step must be at least 2", file=sys.stderr)
            return 2
        if args.port is not None and not _port_free(args.port):
            print(f"hangwatch: error: --port {args.port} is in use: pick another, or leave --port out for a "
                  "free one", file=sys.stderr)
            return 2
        return run_demo(args.case, timeout=args.timeout, linger=args.linger,
                        stall_step=args.stall_step, workdir=args.workdir, port=args.port)
    try:
        ask = _ask(args)
    except UsageError as e:
        print(f"hangwatch: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    if args.command == "diagnose":
        return cmd_diagnose(args, ask)
    if args.command == "nodes":
        return cmd_nodes(args, ask)
    return cmd_status(args, ask)


if __name__ == "__main__":
    sys.exit(main())
