"""What each placeholder of a command rule may hold: data, never an option (pure).

A command's placeholders are filled from the job's identity, and that identity comes from the
ranks' reported environment: a node (or whoever holds its token) writes it. ``SLURM_JOB_ID=--user=root``
once turned ``scancel {slurm_job}`` into ``scancel --user=root``, and ``POD_NAME=--all`` turned
``kubectl delete pod {k8s_pods}`` into ``kubectl delete pod --all``. So each placeholder has a
format: the shape such a value has where it comes from (a Slurm job id is digits, with an array
task after ``_`` and a step after ``.``; a Kubernetes namespace is an RFC 1123 label, a pod name
an RFC 1123 subdomain); a value outside it, or one that starts with ``-``, refuses the action
(audited ``refused``, naming the field). Nothing is quoted or escaped: a value that needs it is
not one of these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# A placeholder in a command argument: {name}.
PLACEHOLDER = re.compile(r"{([^{}]*)}")
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
# How each placeholder's value may look, one item of a list at a time.
FORMATS: dict[str, re.Pattern[str]] = {
    # The monitor's own job id: MASTER_ADDR:PORT (an IPv6 host in brackets), pmix:..., slurm:..., local:PID.
    "job_id": re.compile(r"[A-Za-z0-9\[][A-Za-z0-9_.:@%+=/\[\]-]{0,255}"),
    "verdict": re.compile(r"[a-z][a-z_]{0,31}"),
    "culprit_ranks": re.compile(r"[0-9]{1,9}"),
    # A node's name as the wire takes it (monitor/ingest/wire.py), but never opening with "-".
    "culprit_nodes": re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,127}"),
    # 1234, 1234.0 (a step), 1234_7 (an array task), 1234_7.batch: as squeue and scancel take them.
    "slurm_job": re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?(?:\.(?:[0-9]{1,10}|batch|extern))?"),
    "k8s_namespace": re.compile(_DNS_LABEL),
    "k8s_pods": re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(?:\.{_DNS_LABEL})*"),
    "incident_started_at": re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?"),
    "evidence_url": re.compile(r"https?://[!#-~]{1,2000}"),
    # The rule's own name (monitor/engine/actions/config.py checks it when the file is read).
    "rule": re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}"),
}
# A command argument that is exactly one of these becomes one argument per item (``kubectl delete
# pod a b`` takes pods so); elsewhere a list is joined with ",".
SPREAD = frozenset({"k8s_pods"})


class PlaceholderRefused(ValueError):
    """A placeholder's value is not data of its kind: the action must not run."""

    def __init__(self, name: str, value: str) -> None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        super().__init__(f"{{{name}}} is {shown!r}, not {_KIND[name]}: refused (a placeholder is data, never an "
                         "option)")
        self.name = name


_KIND = {
    "job_id": "a job id", "verdict": "a verdict", "culprit_ranks": "a rank number", "culprit_nodes": "a node name",
    "slurm_job": "a Slurm job id (digits, _task, .step)", "k8s_namespace": "a Kubernetes namespace (RFC 1123 label)",
    "k8s_pods": "a pod name (RFC 1123 subdomain)", "incident_started_at": "a time",
    "evidence_url": "an http(s) URL", "rule": "a rule name",
}
assert set(_KIND) == set(FORMATS)


def used_in(args: Sequence[str]) -> list[str]:
    """The placeholders ``args`` name, in the order of FORMATS."""
    named = {name for arg in args for name in PLACEHOLDER.findall(arg)}
    return [name for name in FORMATS if name in named]


def checked_values(fields: Mapping[str, Any], names: Sequence[str] = tuple(FORMATS)) -> dict[str, list[str]]:
    """The values of the placeholders ``names`` as the items a command may be given, every one
    checked against its format; empty or absent ones are left out (the caller says the job has
    none). Raises ``PlaceholderRefused`` for the first value that is not data of its kind."""
    out: dict[str, list[str]] = {}
    for name in names:
        pattern = FORMATS[name]
        value = fields.get(name)
        if value is None or value == "" or value == [] or value == ():
            continue
        items = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
        for item in items:
            if not pattern.fullmatch(item):
                raise PlaceholderRefused(name, item)
        out[name] = items
    return out


def fill(arg: str, values: Mapping[str, Sequence[str]]) -> list[str]:
    """One command argument with its placeholders filled: usually one argument, several where
    ``arg`` is exactly a spread placeholder. Raises KeyError naming a placeholder with no value."""
    whole = arg[1:-1] if arg.startswith("{") and arg.endswith("}") else None
    if whole in SPREAD:
        if whole not in values:
            raise KeyError(whole)
        return list(values[whole])
    return [arg.format_map({k: ",".join(v) for k, v in values.items()})]
