"""Every ``HANGWATCH_*`` variable something of hangwatch's reads, and one warning for the others.

A variable nothing reads changes nothing, silently: the token file variable misspelt (``_TOKEN_FLE``)
in an environment file leaves the monitor open to any client. The monitor and the agent name such variables at start
(``unknown_variables_warning``), with the known name they most resemble.

The list is the union over the monitor, the agent, the relay, the ``hangwatch`` CLI, the deployment files
and the demo, so that one environment shared by all of them warns of nothing real: the monitor's
``HANGWATCH_MAX_JOBS`` is no typo to the agent. tests/monitor/test_env_names.py holds it to the
code: the monitor's names are its settings' (monitor/web/settings.py), every ``HANGWATCH_*`` name the
sources spell is here, and every name here is read somewhere.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

PREFIX = "HANGWATCH_"
# Names the test suite sets for its own machinery (time scales, namespace marks); no program
# takes a setting from them, and new ones need no entry here.
TEST_PREFIX = PREFIX + "TEST_"

# The monitor: HANGWATCH_<SETTING> for each field of monitor.web.settings.Settings, and the state
# directory its default database lives in.
MONITOR = frozenset({
    "HANGWATCH_HOST", "HANGWATCH_PORT", "HANGWATCH_DB", "HANGWATCH_STATE_DIR", "HANGWATCH_LOG_LEVEL",
    "HANGWATCH_MAX_BODY_BYTES", "HANGWATCH_SNAPSHOT_INTERVAL_S", "HANGWATCH_SNAPSHOT_RETENTION_S",
    "HANGWATCH_SNAPSHOTS_PER_NODE", "HANGWATCH_SNAPSHOT_MAX_BYTES", "HANGWATCH_SNAPSHOT_BUDGET_BYTES",
    "HANGWATCH_VERDICT_RETENTION_S", "HANGWATCH_SUSPECT_WINDOW_S",
    "HANGWATCH_FRESH_READ_RANKS",
    "HANGWATCH_SHED_LAG_S", "HANGWATCH_SHED_KEEP_S", "HANGWATCH_JOB_RETENTION_S", "HANGWATCH_TICK_INTERVAL_S",
    "HANGWATCH_STRAGGLER_WINDOW_S", "HANGWATCH_CONFIRM_ALARMS", "HANGWATCH_MAX_JOBS", "HANGWATCH_MAX_JOBS_PER_NODE", "HANGWATCH_JOB_ROOM_SILENT_S", "HANGWATCH_MAX_RANKS", "HANGWATCH_MAX_NODES", "HANGWATCH_MAX_WORLD_SIZE",
    "HANGWATCH_MAX_SILENT_BYTES",
    "HANGWATCH_MAX_CONNECTIONS", "HANGWATCH_HEADER_TIMEOUT_S", "HANGWATCH_BODY_TIMEOUT_S",
    "HANGWATCH_MAX_HEADER_BYTES", "HANGWATCH_MAX_HEADERS",
    "HANGWATCH_TOKEN_FILE", "HANGWATCH_READ_TOKEN_FILE", "HANGWATCH_METRICS_TOKEN_FILE", "HANGWATCH_RELAY_TOKEN_FILE",
    "HANGWATCH_SSL_CERTFILE", "HANGWATCH_SSL_KEYFILE", "HANGWATCH_GRAFANA_URL", "HANGWATCH_RUNBOOK_URL",
    "HANGWATCH_ACTIONS_FILE", "HANGWATCH_CAPTURE_AFTER_S", "HANGWATCH_CAPTURE_DIR", "HANGWATCH_CAPTURE_MAX_BYTES",
    "HANGWATCH_CAPTURE_RETENTION_S",
})
# The agent (agent/cli.py).
AGENT = frozenset({"HANGWATCH_TOKEN_FILE", "HANGWATCH_CA_FILE", "HANGWATCH_OUTAGE_JOURNAL",
                   "HANGWATCH_DUMP_OTHER_USERS", "HANGWATCH_ALLOW_SIGNALS"})
# The hangwatch command (hangwatch/cli.py).
CLI = frozenset({"HANGWATCH_MONITOR", "HANGWATCH_READ_TOKEN_FILE", "HANGWATCH_CA_FILE", "HANGWATCH_TIMEOUT_S"})
# Read by the deployment files rather than a program: the systemd unit's and the DaemonSet's
# command lines are made of them (deploy/), and the set-up scripts' venv (scripts/).
DEPLOYMENT = frozenset({"HANGWATCH_MONITOR", "HANGWATCH_AGENT_ARGS", "HANGWATCH_INTERVAL", "HANGWATCH_VENV"})

# The relay (monitor/relay/cli.py): the monitor's names for what it shares with the monitor, and these.
RELAY = frozenset({"HANGWATCH_MONITOR", "HANGWATCH_HOST", "HANGWATCH_PORT", "HANGWATCH_TOKEN_FILE",
                   "HANGWATCH_METRICS_TOKEN_FILE", "HANGWATCH_RELAY_TOKEN_FILE", "HANGWATCH_CA_FILE",
                   "HANGWATCH_SSL_CERTFILE", "HANGWATCH_SSL_KEYFILE", "HANGWATCH_MAX_BODY_BYTES",
                   "HANGWATCH_LOG_LEVEL"})

# Set by the monitor for an action's command (monitor/engine/actions/execute.py), read by that command.
ACTION_COMMAND = frozenset({"HANGWATCH_JOB_ID", "HANGWATCH_VERDICT", "HANGWATCH_CULPRIT_RANKS",
                            "HANGWATCH_CULPRIT_NODES"})

KNOWN = MONITOR | AGENT | CLI | RELAY | DEPLOYMENT | ACTION_COMMAND
# How alike (difflib's ratio of the parts after the prefix) a known name must be to be suggested:
# TOKEN_FLE -> TOKEN_FILE (0.95), MAXJOBS -> MAX_JOBS (0.93); FOO -> DB (0) is no suggestion.
CLOSE_ENOUGH = 0.75


def unknown_variables(environ: Iterable[str], known: Iterable[str] = KNOWN) -> list[str]:
    """The names in ``environ`` that look like hangwatch's (any case) and that nothing reads, sorted."""
    known = set(known)
    return sorted(name for name in environ
                  if name.upper().startswith(PREFIX) and name not in known and not name.startswith(TEST_PREFIX))


def closest_known(name: str, known: Iterable[str] = KNOWN) -> str | None:
    """The known name ``name`` is most likely a misspelling of, if one is close."""
    by_suffix = {k[len(PREFIX):]: k for k in known}
    close = difflib.get_close_matches(name.upper()[len(PREFIX):], sorted(by_suffix), n=1, cutoff=CLOSE_ENOUGH)
    return by_suffix[close[0]] if close else None


def unknown_variables_warning(environ: Mapping[str, str] | Iterable[str], known: Iterable[str] = KNOWN) -> str | None:
    """One line naming every unknown ``HANGWATCH_*`` variable (never its value: it may be a secret),
    each with a did-you-mean when a known name is close; None when there is none."""
    known = frozenset(known)
    names = unknown_variables(environ, known)
    if not names:
        return None
    described = []
    for name in names:
        # repr: a name is any bytes but "=" and NUL; a control character in it must not reach a terminal raw.
        shown = name if name.isprintable() else repr(name)
        guess = closest_known(name, known)
        described.append(f"{shown} (did you mean {guess}?)" if guess else shown)
    return (f"ignoring {len(names)} unknown {PREFIX}* environment variable{'s' if len(names) > 1 else ''} "
            f"(no hangwatch program reads {'them' if len(names) > 1 else 'it'}): {', '.join(described)}")


__all__ = ["KNOWN", "PREFIX", "TEST_PREFIX", "closest_known", "unknown_variables", "unknown_variables_warning"]
