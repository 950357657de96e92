"""hangwatch-agent command line: options -> Config, then the loop until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hangwatch_common.cli_common import (
    DefaultsHelpFormatter,
    OneLineParser,
    UsageError,
    add_refused_token_option,
    add_version_option,
    tls_verify,
)
from agent.report import default_node_name
from agent.runner import Agent, Config
from agent.selfwatch import lower_priority
from agent.sender import ShardedSender
from agent.settings import AgentSettings
from hangwatch_common.env_names import unknown_variables_warning
from hangwatch_common.logs import configure_logging
from hangwatch_common.settings import add_flags, declared, given, load
from hangwatch_common.token_file import TokenFileError, TokenSource

log = logging.getLogger("agent")
DESCRIPTION = ("hangwatch agent: samples the training processes on this node (progress, CPU, I/O, stacks, "
               "sockets) and reports them to the monitor.")
NCCL_RAS_ONCE_WAIT_S = 2.0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hangwatch-agent", formatter_class=DefaultsHelpFormatter,
                      description=DESCRIPTION + " Each setting but --monitor is also read from its HANGWATCH_* "
                      "variable, and each from the --config file; the option wins, then the variable, then the file.")
    add_version_option(p)
    add_flags(p, AgentSettings)
    add_refused_token_option(p)
    p.add_argument("--once", action="store_true",
                   help="sample twice one interval apart, print the report JSON and exit")
    return p


def parse_config(
    argv: list[str] | None, environ: Mapping[str, str] | None = None
) -> tuple[Config, argparse.Namespace]:
    """``environ``: where the HANGWATCH_* variables are read (os.environ)."""
    args = build_parser().parse_args(argv)
    settings = load(AgentSettings, args, os.environ if environ is None else environ)
    if not settings.monitor and not args.once:
        raise UsageError("--monitor URL is required (unless --once)")
    # For main's logging; -v is the older spelling of --log-level debug.
    args.log_level = "debug" if settings.verbose else settings.log_level
    args.log_format = settings.log_format
    args.config_file = settings.config
    same_named = {f.name: getattr(settings, f.name) for f in dataclasses.fields(Config) if hasattr(settings, f.name)}
    config = Config(**{**same_named, "node": settings.node or default_node_name(),
                       "monitors": tuple(dict.fromkeys(settings.monitor)), "logs": settings.log,
                       "jobs": frozenset(settings.job), "redact_patterns": settings.redact_pattern,
                       "outage_journal_dir": settings.outage_journal})
    return config, args


def setting_names(args: argparse.Namespace) -> dict[str, str]:
    """How errors name each setting: the option when it was given, else its variable."""
    typed = given(args)[1]
    return {item.name: typed.get(item.name) or item.env or item.flags[0] for item in declared(AgentSettings)}


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
    configure_logging(args.log_level, args.log_format)
    if args.config_file:
        log.info("settings from %s (and the flags and variables given)", args.config_file)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per report
    # A misspelt setting (TOKEN_FLE for TOKEN_FILE) is otherwise ignored without a word.
    unknown = unknown_variables_warning(os.environ)
    if unknown:
        log.warning("%s", unknown)
    try:
        # The sender first: an unusable token file or CA bundle is the one line a person sees, not
        # the agent's own start-up lines before it. Orders reach the agent once it exists (they come
        # only with the answers to its reports).
        holder: list[Agent] = []
        sender = make_sender(config, setting_names(args), lambda *order: holder[0].take_orders(*order)) \
            if config.monitors else None
        agent = Agent(config)
        holder.append(agent)
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
