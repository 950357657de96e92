"""Secrets out of command lines and reported environment values, before anything leaves the node.

Command lines of ranks, launchers and leftovers go to the monitor, and people put tokens on
them (``--hf_token=hf_...``, ``env WANDB_API_KEY=... python train.py``, a database URL with a
password). What is hidden, each replaced with ``***`` (the name stays, so the operator sees
what was there):

- the value of an option whose name matches a secret-name pattern: ``--hf_token=x``,
  ``--hf_token x``, ``-password x``, ``-Dpassword=x``;
- the value of a ``NAME=value`` word whose name matches (``env HF_TOKEN=x``, Hydra's
  ``wandb.api_key=x``);
- credentials in a URL (``scheme://user:pass@host`` -> ``scheme://user:***@host``,
  ``scheme://token@host`` -> ``scheme://***@host``), URL query parameters whose name matches
  (``?token=x``), and ``Bearer x`` / ``Authorization: Basic x``.

Secret names are regular expressions searched anywhere in the name, case-insensitive: on
purpose a substring, so ``--api-key``, ``--openai_api_key`` and ``--keyfile`` are all caught.
The price is false positives on the safe side: ``--max_tokens 5``, ``--tokenizer gpt2``,
``--monkey-patch x`` lose their values too (``--keep-going`` does not: no "key" in it).

``--x value``: the next word is the value unless it starts with ``-``; a secret value that
itself starts with ``-`` stays (rare for tokens). A word holding whitespace (``bash -c "..."``,
a title set with setproctitle) is split on it and redacted word by word. Not covered:
secrets inside JSON or YAML given inline (``--config '{"api_key": ...}'``) and ``user:pass@host``
without a scheme.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SECRET = "***"
DEFAULT_NAME_PATTERNS = ("token", "password", "passwd", "secret", "key", "credential")
# What discovery reports of a command line (chars, after redaction: a cut never splits a secret).
CMDLINE_MAX_CHARS = 4096

# -x, --x, --x=value; a leading quote when inside a shell string (bash -c "... '--token=x'").
_OPTION = re.compile(r"""^(?P<lead>['"]?-{1,2})(?P<name>[^\s=-][^\s=]*)(?:=(?P<value>.*))?$""", re.DOTALL)
# NAME=value (env, Hydra overrides with + or ~ in front).
_ASSIGNMENT = re.compile(r"""^(?P<lead>['"]?[+~]{0,2})(?P<name>[A-Za-z_][\w.\-/]*)=(?P<value>.*)$""", re.DOTALL)
# scheme://userinfo@ -- userinfo runs to the last @ before the path (passwords hold @ unencoded).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#]*)@")
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&#\s]+)=(?P<value>[^&#\s]*)")
_AUTH_HEADER = re.compile(r"(?i)(?P<lead>\bauthorization\s*:\s*(?:(?:bearer|basic|token)\s+)?)(?P<value>[^\s'\"]+)")
_BEARER = re.compile(r"(?i)(?P<lead>\bbearer\s+)(?P<value>[^\s'\"]+)")
_SPACE = re.compile(r"(\s+)")


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    return match["scheme"] + (f"{user}:{SECRET}@" if colon else f"{SECRET}@")


@dataclass(frozen=True)
class Redactor:
    """Redacts argv and free text; ``names``: the secret-name patterns."""

    names: tuple[re.Pattern[str], ...]

    def cmdline(self, argv: Sequence[str]) -> str:
        """What is reported as a process's command line."""
        return " ".join(self.argv(argv))[:CMDLINE_MAX_CHARS]

    def argv(self, argv: Sequence[str]) -> list[str]:
        out: list[str] = []
        hide_next = False
        for word in argv:
            if not word:
                out.append(word)
                continue
            if hide_next and not word.startswith("-"):
                out.append(SECRET)
                hide_next = False
                continue
            hide_next = False
            if _SPACE.search(word):
                parts = _SPACE.split(self.text(word))
                parts[0::2] = self.argv(parts[0::2])  # no whitespace left in these: no deeper
                out.append("".join(parts))
                continue
            redacted, hide_next = self._word(word)
            out.append(redacted)
        return out

    def text(self, text: str) -> str:
        """URL credentials, secret query parameters and authorization values in any text."""
        if "://" in text:
            text = _URL_USERINFO.sub(_userinfo, text)
        if "=" in text:
            text = _QUERY_PARAM.sub(self._query_param, text)
        text = _AUTH_HEADER.sub(lambda m: m["lead"] + SECRET, text)
        return _BEARER.sub(lambda m: m["lead"] + SECRET, text)

    def is_secret(self, name: str) -> bool:
        return any(p.search(name) for p in self.names)

    def _word(self, word: str) -> tuple[str, bool]:
        """(the word redacted, whether the next word is this option's secret value)."""
        option = _OPTION.match(word)
        if option and self.is_secret(option["name"]):
            if option["value"] is None:
                return word, True
            return f"{option['lead']}{option['name']}={SECRET if option['value'] else ''}", False
        if not option:
            assignment = _ASSIGNMENT.match(word)
            if assignment and assignment["value"] and self.is_secret(assignment["name"]):
                return f"{assignment['lead']}{assignment['name']}={SECRET}", False
        return self.text(word), False

    def _query_param(self, match: re.Match[str]) -> str:
        if match["value"] and self.is_secret(match["name"]):
            return f"{match['lead']}{match['name']}={SECRET}"
        return match[0]


def make_redactor(extra_patterns: Iterable[str] = (), defaults: bool = True) -> Redactor:
    """``extra_patterns``: more secret-name regexes (--redact-pattern); ``defaults``: keep
    DEFAULT_NAME_PATTERNS (URL credentials and authorization values are always hidden)."""
    patterns = [*(DEFAULT_NAME_PATTERNS if defaults else ()), *extra_patterns]
    # Compiled one by one, not joined: a user's pattern may carry its own inline flags.
    return Redactor(tuple(re.compile(p, re.IGNORECASE) for p in patterns))


DEFAULT_REDACTOR = make_redactor()
