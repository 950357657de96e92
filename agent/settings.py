"""The agent's settings, each declared once (hangwatch_common/settings.py makes its flag, variable and
``--help`` entry); agent/cli.py builds the runner's Config from them."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from agent.logpatterns import compile_user_pattern
from agent.nccl_ras import parse_address
from agent.report import NODE_NAME
from agent.selfwatch import DEFAULT_MAX_CPU_PERCENT, DEFAULT_MAX_RSS_MB, EXIT_OVER_MEMORY, MIN_NICE
from hangwatch_common.settings import DaemonSettings, setting


def _monitor_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL")
    try:
        parts.port  # noqa: B018 -- raises on a bad port
    except ValueError:
        raise ValueError("must be an http(s) URL with a port from 1 to 65535") from None
    return text.rstrip("/")


def _finite(kind: type, why: str):
    """Text -> a finite ``kind`` at least 0; ValueError(why) for anything else."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(why) from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(why)
        return value

    return parse


def _node(text: str) -> str:
    if not NODE_NAME.match(text):
        raise ValueError("must match [A-Za-z0-9_.:-]{1,128}")
    return text


def _step_regex(text: str) -> re.Pattern[str]:
    try:
        return compile_user_pattern(text)
    except (re.error, ValueError) as e:
        raise ValueError(f"must be a regex with a group ({e})") from None


def _name_pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise ValueError(f"must be a regex ({e})") from None
    return text


def _cap(kind: type):
    """A self-limit: 0 is none (None)."""
    number = _finite(kind, "must be 0 (no cap) or more")
    return lambda text: number(text) or None


def _ras_address(text: str) -> str:
    if parse_address(text) is None:
        raise ValueError("must be HOST:PORT")
    return text


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise ValueError("must be a directory")
    return text


@dataclass(frozen=True)
class AgentSettings(DaemonSettings):
    config_table: ClassVar[str] = "agent"
    # HANGWATCH_MONITOR is not read: it is the monitor the hangwatch command asks, and an agent run
    # with --once in a shell that sets it would post its report there.
    monitor: tuple[str, ...] = setting((), parse=_monitor_url, metavar="URL", env=False, shown_default="none: "
                                       "required unless --once", help="monitor base URL, e.g. http://10.0.0.5:8787; "
                                       "repeat for monitors sharded by job id (each job goes to one of them, "
                                       "docs/scaling.md)")
    interval: float = setting(1.0, parse=_finite(float, "must be a positive number of seconds"), positive=True,
                              metavar="SECONDS", help="seconds between samples")
    node: str | None = setting(None, parse=_node, help="node name", shown_default="the hostname")
    log: tuple[str, ...] = setting((), metavar="[JOB=]PATH", shown_default="none", help="extra log file to follow "
                                   "(e.g. the launcher's output); repeatable, space-separated in the variable. Its "
                                   "lines count for the job named (job id, torchelastic run id or Slurm job id), else "
                                   "for the job whose processes write it (directly or through a pipe, as with tee), "
                                   "else for the only job on the node; otherwise for no job")
    step_regex: re.Pattern[str] | None = setting(None, parse=_step_regex, metavar="REGEX", help="progress pattern: "
                                                 "named group 'step' or the first group", shown_default="the built-in "
                                                 "formats: nanochat, Megatron, torchtitan, tqdm, 'step N'")
    proc_root: str = setting("/proc", parse=_directory, metavar="DIR", help="where /proc is read (tests point it at "
                             "fixture trees)")
    py_spy: str | None = setting(None, metavar="PATH", help="py-spy binary", shown_default="the one beside the "
                                 "agent's Python, else py-spy on PATH")
    stacks: bool = setting(True, help="take the ranks' stacks with py-spy")
    dump_other_users: bool = setting(False, help="let py-spy dump (and so briefly stop) the ranks of users other than "
                                     "the agent's. Off: another user's rank has no stack, and its stack_error says "
                                     "why. A root agent watching other users' jobs needs it on (the systemd unit and "
                                     "the DaemonSet turn it on). py-spy never dumps the agent, its parent or its "
                                     "children, nor a process that is not Python")
    max_rss_mb: int | None = setting(DEFAULT_MAX_RSS_MB, parse=_cap(int), metavar="MB", help=f"exit with status "
                                     f"{EXIT_OVER_MEMORY} (for systemd or Kubernetes to restart it) when the agent's "
                                     "resident memory passes this; 0: no cap")
    max_cpu_percent: float | None = setting(DEFAULT_MAX_CPU_PERCENT, parse=_cap(float), metavar="PERCENT",
                                            help="start no stack dump while the agent (py-spy included) used more "
                                            "than this percent of one core over the last 30 s; 0: no cap")
    nice: int = setting(0, at_least=0, at_most=19, help="run the sampling loop (and py-spy) at this nice value at "
                        f"least, below the training it watches (the systemd unit sets Nice={MIN_NICE}); 0: leave the "
                        "priority as it is")
    job: tuple[str, ...] = setting((), metavar="JOB_ID", shown_default="every job", help="only track ranks of this "
                                   "job id; repeatable, space-separated in the variable")
    own_pid_namespace: bool = setting(False, help="track only processes in the agent's own PID namespace (leave "
                                      "containers' ranks to the agents inside them)")
    nccl_ras: bool = setting(True, help="ask NCCL's RAS service for its view of the ranks")
    nccl_ras_addr: str | None = setting(None, parse=_ras_address, metavar="HOST:PORT", help="where NCCL's RAS service "
                                        "listens", shown_default="the ranks' NCCL_RAS_ADDR, else localhost:28028")
    flight_recorder: bool = setting(True, help="read the ranks' PyTorch Flight Recorder dumps "
                                    "(TORCH_FR_DUMP_TEMP_FILE<rank>)")
    redact_pattern: tuple[str, ...] = setting((), parse=_name_pattern, metavar="REGEX", shown_default="none",
                                              help="hide the values of options and NAME=value words whose name "
                                              "matches this regex too (case-insensitive, searched in the name); "
                                              "repeatable, space-separated in the variable. Hidden by default: names "
                                              "with token, password, passwd, secret, key, credential; always: URL "
                                              "credentials")
    default_redaction: bool = setting(True, help="hide the values of the default secret names too (off: only "
                                      "--redact-pattern names; URL credentials still are)")
    token_file: str | None = setting(None, metavar="PATH", help="file holding the bearer token for the monitor "
                                     "(mode 600; re-read when it changes)")
    ca_file: str | None = setting(None, metavar="PATH", help="CA bundle that verifies an https monitor's certificate "
                                  "(instead of the default bundle)")
    outage_journal: str | None = setting(None, metavar="DIR", help="keep what changes while the monitor is "
                                         "unreachable in files in DIR too, so an agent restarted during an outage "
                                         "still delivers it; unset: kept in memory")
    allow_signals: bool = setting(False, help="let the monitor's opt-in actions signal this node's culprit ranks "
                                  "(SIGTERM, SIGABRT, ...; only live ranks this agent tracks); off: refused")
    # The agent's older spelling, kept working.
    verbose: bool = setting(False, aliases=("-v",), help="the same as --log-level debug (whatever that says)")
