"""hangwatch-agent command line: options -> Config, then the loop until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from hangwatch_common.cli_common import (
    DefaultsHelpFormatter,
    OneLineParser,
    UsageError,
    add_access_options,
    add_version_option,
    given_by,
    tls_verify,
)
from agent.logpatterns import compile_user_pattern
from agent.nccl_ras import parse_address
from agent.report import NODE_NAME, default_node_name
from agent.runner import Agent, Config
from agent.selfwatch import DEFAULT_MAX_CPU_PERCENT, DEFAULT_MAX_RSS_MB, EXIT_OVER_MEMORY, MIN_NICE, lower_priority
from agent.sender import ShardedSender
from hangwatch_common.env_names import unknown_variables_warning
from hangwatch_common.token_file import TokenFileError, TokenSource

log = logging.getLogger("agent")
DESCRIPTION = ("hangwatch agent: samples the training processes on this node (progress, CPU, I/O, stacks, "
               "sockets) and reports them to the monitor.")
NCCL_RAS_ONCE_WAIT_S = 2.0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _monitor_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    try:
        parts.port  # noqa: B018 -- raises on a bad port
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad port in URL: {text!r}") from None
    return text.rstrip("/")


def _node(text: str) -> str:
    if not NODE_NAME.match(text):
        raise argparse.ArgumentTypeError(f"node name must match [A-Za-z0-9_.:-]{{1,128}}: {text!r}")
    return text


def _regex(text: str) -> re.Pattern[str]:
    try:
        return compile_user_pattern(text)
    except (re.error, ValueError) as e:
        raise argparse.ArgumentTypeError(f"bad --step-regex: {e}") from None


def _name_pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"bad --redact-pattern: {e}") from None
    return text


def _cap(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"must be 0 (no cap) or more: {text!r}")
        return value or None

    return parse


def _nice(text: str) -> int:
    if not text.isdecimal() or int(text) > 19:
        raise argparse.ArgumentTypeError(f"must be a nice value from 0 to 19: {text!r}")
    return int(text)


TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _env_flag(environ: Mapping[str, str], name: str) -> bool:
    word = environ.get(name, "").strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise UsageError(f"{name} must be 1 or 0, not {word[:32]!r}")


def _ras_address(text: str) -> str:
    if parse_address(text) is None:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hangwatch-agent", description=DESCRIPTION, formatter_class=DefaultsHelpFormatter)
    add_version_option(p)
    p.add_argument("--monitor", type=_monitor_url, action="append", default=[], metavar="URL",
                   help="monitor base URL, e.g. http://10.0.0.5:8787; repeat for monitors sharded by job id "
                        "(each job goes to one of them, docs/scaling.md); required unless --once")
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="SECONDS", help="seconds between samples")
    p.add_argument("--node", type=_node, default=None, help="node name (default: hostname)")
    p.add_argument("--log", action="append", default=[], metavar="[JOB=]PATH",
                   help="extra log file to follow (e.g. the launcher's output); repeatable. Its lines count for "
                        "the job named (job id, torchelastic run id or Slurm job id), else for the job whose "
                        "processes write it (directly or through a pipe, as with tee), else for the only job on "
                        "the node; otherwise for no job")
    p.add_argument("--step-regex", type=_regex, default=None, metavar="REGEX",
                   help="progress pattern: named group 'step' or the first group (default: the built-in "
                        "formats: nanochat, Megatron, torchtitan, tqdm, 'step N')")
    p.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--py-spy", default=None, metavar="PATH",
                   help="py-spy binary (default: the one beside the agent's Python, else py-spy on PATH)")
    p.add_argument("--no-stacks", action="store_true", help="never run py-spy")
    p.add_argument("--dump-other-users", action=argparse.BooleanOptionalAction, default=None,
                   help="let py-spy dump (and so briefly stop) the ranks of users other than the agent's. Off by "
                        "default: another user's rank then has no stack, and its stack_error says why. A root "
                        "agent watching other users' jobs needs it on (the systemd unit and the DaemonSet turn it "
                        "on). Default: $HANGWATCH_DUMP_OTHER_USERS (1 or 0). py-spy never dumps the agent, its "
                        "parent or its children, nor a process that is not Python")
    p.add_argument("--max-rss-mb", type=_cap(int), default=DEFAULT_MAX_RSS_MB, metavar="MB",
                   help=f"exit with status {EXIT_OVER_MEMORY} (for systemd or Kubernetes to restart it) when the "
                        f"agent's resident memory passes this; 0: no cap (default: {DEFAULT_MAX_RSS_MB})")
    p.add_argument("--max-cpu-percent", type=_cap(float), default=DEFAULT_MAX_CPU_PERCENT, metavar="PERCENT",
                   help="start no stack dump while the agent (py-spy included) used more than this percent of "
                        "one core over the last 30 s; 0: no cap (default: %(default)s)")
    p.add_argument("--nice", type=_nice, default=0, metavar="N",
                   help="run the sampling loop (and py-spy) at this nice value at least, below the training it "
                        f"watches (the systemd unit sets Nice={MIN_NICE}); 0: leave the priority as it is")
    p.add_argument("--job", action="append", default=[], metavar="JOB_ID",
                   help="only track ranks of this job id; repeatable (default: every job)")
    p.add_argument("--own-pid-namespace", action="store_true",
                   help="track only processes in the agent's own PID namespace (leave containers' ranks "
                        "to the agents inside them)")
    p.add_argument("--no-nccl-ras", action="store_true",
                   help="never ask NCCL's RAS service (localhost:28028) for its view of the ranks")
    p.add_argument("--nccl-ras-addr", type=_ras_address, default=None, metavar="HOST:PORT",
                   help="where NCCL's RAS service listens (default: the ranks' NCCL_RAS_ADDR, else "
                        "localhost:28028)")
    p.add_argument("--no-flight-recorder", action="store_true",
                   help="never read the ranks' PyTorch Flight Recorder dumps (TORCH_FR_DUMP_TEMP_FILE<rank>)")
    p.add_argument("--redact-pattern", type=_name_pattern, action="append", default=[], metavar="REGEX",
                   help="hide the values of options and NAME=value words whose name matches this regex too "
                        "(case-insensitive, searched in the name); repeatable. Hidden by default: names "
                        "with token, password, passwd, secret, key, credential; always: URL credentials")
    p.add_argument("--no-default-redaction", action="store_true",
                   help="only --redact-pattern names are hidden (URL credentials still are)")
    add_access_options(p, "file holding the bearer token for the monitor (mode 600; re-read when it changes); "
                          "default: $HANGWATCH_TOKEN_FILE")
    p.add_argument("--outage-journal", default=None, metavar="DIR",
                   help="keep what changes while the monitor is unreachable in files in DIR too, so an agent "
                        "restarted during an outage still delivers it (default: $HANGWATCH_OUTAGE_JOURNAL; "
                        "unset: kept in memory)")
    p.add_argument("--allow-signals", action="store_true", default=None,
                   help="let the monitor's opt-in actions signal this node's culprit ranks (SIGTERM, SIGABRT, ...; "
                        "only live ranks this agent tracks; default: $HANGWATCH_ALLOW_SIGNALS, else refused)")
    p.add_argument("--once", action="store_true",
                   help="sample twice one interval apart, print the report JSON and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def parse_config(
    argv: list[str] | None, environ: Mapping[str, str] | None = None
) -> tuple[Config, argparse.Namespace]:
    """``environ``: where HANGWATCH_TOKEN_FILE and HANGWATCH_CA_FILE are read (os.environ)."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    if not args.monitor and not args.once:
        raise UsageError("--monitor URL is required (unless --once)")
    if not os.path.isdir(args.proc_root):
        raise UsageError(f"--proc-root {args.proc_root!r} is not a directory")
    config = Config(
        monitors=tuple(dict.fromkeys(args.monitor)),
        interval=args.interval,
        node=args.node or default_node_name(),
        logs=tuple(args.log),
        step_regex=args.step_regex,
        proc_root=args.proc_root,
        py_spy=args.py_spy,
        stacks=not args.no_stacks,
        jobs=frozenset(args.job),
        own_pid_namespace=args.own_pid_namespace,
        nccl_ras=not args.no_nccl_ras,
        nccl_ras_addr=args.nccl_ras_addr,
        flight_recorder=not args.no_flight_recorder,
        redact_patterns=tuple(args.redact_pattern),
        default_redaction=not args.no_default_redaction,
        # An empty variable is as good as unset (EnvironmentFile lines left blank).
        token_file=args.token_file or environ.get("HANGWATCH_TOKEN_FILE") or None,
        ca_file=args.ca_file or environ.get("HANGWATCH_CA_FILE") or None,
        outage_journal_dir=args.outage_journal or environ.get("HANGWATCH_OUTAGE_JOURNAL") or None,
        dump_other_users=(
            args.dump_other_users if args.dump_other_users is not None
            else _env_flag(environ, "HANGWATCH_DUMP_OTHER_USERS")
        ),
        allow_signals=args.allow_signals or _env_flag(environ, "HANGWATCH_ALLOW_SIGNALS"),
        max_rss_mb=args.max_rss_mb,
        max_cpu_percent=args.max_cpu_percent,
        nice=args.nice,
    )
    return config, args


def setting_names(args: argparse.Namespace) -> dict[str, str]:
    """How errors name the file settings: the option when given, else the variable they came from."""
    return {
        "token_file": given_by("--token-file", "HANGWATCH_TOKEN_FILE", args.token_file),
        "ca_file": given_by("--ca-file", "HANGWATCH_CA_FILE", args.ca_file),
        "outage_journal": given_by("--outage-journal", "HANGWATCH_OUTAGE_JOURNAL", args.outage_journal),
    }


def make_sender(config: Config, named: Mapping[str, str] | None = None,
                on_orders: Callable[[object, object], None] | None = None) -> ShardedSender:
    """The monitors' sender with the token and CA; an unusable token file or CA bundle is a
    UsageError (exit 2 at start) naming the setting as ``named`` says (setting_names)."""
    named = {"token_file": "--token-file", "ca_file": "--ca-file", "outage_journal": "--outage-journal",
             **(named or {})}
    token = None
    if config.token_file:
        try:
            token = TokenSource(config.token_file).current
        except TokenFileError as e:
            raise UsageError(f"{named['token_file']}: {e}") from None
    verify = tls_verify(config.ca_file, named["ca_file"])
    journal_dir = None
    if config.outage_journal_dir:
        journal_dir = Path(config.outage_journal_dir)
        try:
            journal_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise UsageError(f"{named['outage_journal']} {journal_dir}: {e.strerror or e}") from None
    return ShardedSender(config.monitors, token=token, verify=verify, journal_dir=journal_dir, on_orders=on_orders)


def run_once(agent: Agent, config: Config) -> dict:
    agent.one_shot = True
    agent.tick(schedule_stacks=False)
    time.sleep(config.interval)
    agent.tick(schedule_stacks=False)
    agent.dump_all_now()
    if agent.nccl_ras is not None:  # the poll the first tick started (a local answer takes ms)
        agent.nccl_ras.wait(NCCL_RAS_ONCE_WAIT_S)
    if agent.flight_recorder is not None:
        agent.flight_recorder.wait(NCCL_RAS_ONCE_WAIT_S)
    return agent.report(time.time())


def main(argv: list[str] | None = None) -> int:
    try:
        config, args = parse_config(argv)
    except UsageError as e:
        print(f"hangwatch-agent: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s hangwatch-agent %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per report
    # A misspelt setting (TOKEN_FLE for TOKEN_FILE) is otherwise ignored without a word.
    unknown = unknown_variables_warning(os.environ)
    if unknown:
        log.warning("%s", unknown)
    try:
        agent = Agent(config)
        sender = make_sender(config, setting_names(args), agent.take_orders) if config.monitors else None
    except UsageError as e:
        print(f"hangwatch-agent: error: {e}", file=sys.stderr)
        return 2
    agent.start()
    try:
        if args.once:
            report = run_once(agent, config)
            json.dump(report, sys.stdout)
            sys.stdout.write("\n")
            if sender is not None:
                ok = sender.post(report)
                sender.close()
                return 0 if ok else 1
            return 0
        return run_loop(agent, config, sender)
    finally:
        agent.close()


def run_loop(agent: Agent, config: Config, sender: ShardedSender) -> int:
    stop = threading.Event()

    def on_signal(signum, _frame):
        if stop.is_set():  # a second Ctrl-C: stop now
            os._exit(1)
        log.info("got %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sender.start()
    nice = lower_priority(config.nice)
    log.info(
        "reporting to %s every %.3g s as node %s (py-spy: %s, %s; token: %s; nice %d)",
        ", ".join(config.monitors), config.interval, config.node, agent.agent_info()["py_spy"],
        "any user's ranks" if config.dump_other_users else f"only uid {os.geteuid()}'s ranks",
        f"from {config.token_file}" if config.token_file else "none", nice,
    )
    try:
        agent.run(stop, sender)
    finally:
        sender.stop()
    return agent.exit_status


if __name__ == "__main__":
    sys.exit(main())
