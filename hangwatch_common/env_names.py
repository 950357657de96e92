"""Every ``HANGWATCH_*`` variable something of hangwatch's reads, and one warning for the others.

A variable nothing reads changes nothing, silently: the token file variable misspelt (``_TOKEN_FLE``)
in an environment file leaves the monitor open to any client. The monitor and the agent name such variables at start
(``unknown_variables_warning``), with the known name they most resemble.

The list is the union over the monitor, the agent, the relay, the ``hangwatch`` CLI, the deployment files
and the demo, so that one environment shared by all of them warns of nothing real: the monitor's
``HANGWATCH_MAX_JOBS`` is no typo to the agent. The daemons' names come from their settings'
declarations (declared_names.py, written by scripts/settings-docs.py); tests/monitor/test_env_names.py
holds the rest to the code: every ``HANGWATCH_*`` name the sources spell is known, and every known
name is read somewhere.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from hangwatch_common.declared_names import AGENT, MONITOR, RELAY

PREFIX = "HANGWATCH_"
# Names the test suite sets for its own machinery (time scales, namespace marks); no program
# takes a setting from them, and new ones need no entry here.
TEST_PREFIX = PREFIX + "TEST_"

# The hangwatch command (hangwatch/cli.py).
CLI = frozenset({"HANGWATCH_MONITOR", "HANGWATCH_READ_TOKEN_FILE", "HANGWATCH_CA_FILE", "HANGWATCH_TIMEOUT_S"})
# Read by the deployment files rather than a program: the systemd unit's and the DaemonSet's
# command lines are made of them (deploy/), and the set-up scripts' venv (scripts/).
DEPLOYMENT = frozenset({"HANGWATCH_MONITOR", "HANGWATCH_AGENT_ARGS", "HANGWATCH_INTERVAL", "HANGWATCH_VENV"})

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
