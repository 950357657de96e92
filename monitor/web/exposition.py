"""A lean writer of the Prometheus text format (0.0.4) for the monitor's per-job families.

prometheus_client builds a Sample object per value and validates every name on the way out:
fine for a few hundred series, a second of CPU for the ~150,000 series of 10,000 ranks. Here a
family is its HELP/TYPE header and a list of ready-made lines; label values are escaped once.
The output parses the same (tests read it with prometheus_client's own parser).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import Metric


def escape(value: str) -> str:
    """A label value as the text format wants it inside double quotes."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


_NOT_FINITE = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def number(value: float) -> str:
    """A sample's value as the text format writes it (``2`` as ``2.0``, infinity as ``+Inf``)."""
    text = repr(float(value))
    # Every finite float's repr ends in a digit; "nan", "inf" and "-inf" do not.
    return text if text[-1] <= "9" else _NOT_FINITE[text]


def labels(names: Sequence[str], values: Sequence[str]) -> str:
    """``{a="x",b="y"}`` (or nothing), values escaped: build once, reuse for every sample of the series."""
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{escape(v)}"' for n, v in zip(names, values)) + "}"


class Family:
    """One metric family. Counters take their name without ``_total``; samples get it."""

    __slots__ = ("name", "help", "kind", "sample_name", "lines")

    def __init__(self, name: str, help: str, kind: str = "gauge") -> None:
        self.name = name
        self.help = help
        self.kind = kind
        self.sample_name = name + "_total" if kind == "counter" else name
        self.lines: list[str] = []

    def add(self, label_text: str, value: float) -> None:
        self.lines.append(f"{self.sample_name}{label_text} {number(value)}")


def render(families: Iterable[Family]) -> bytes:
    out: list[str] = []
    for f in families:
        help_text = f.help.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {f.sample_name} {help_text}")
        out.append(f"# TYPE {f.sample_name} {f.kind}")
        out.extend(f.lines)
    out.append("")
    return "\n".join(out).encode()


def from_client(metric: Metric) -> list[Family]:
    """A prometheus_client family (a stock collector's output) as this writer's families.

    Samples keep the client's names (a counter's ``_total``); ``_created`` samples become a gauge
    family of their own, as the client's text writer puts them, so both parse the same."""
    family = Family(metric.name, metric.documentation, metric.type)
    created = Family(metric.name + "_created", metric.documentation)
    for sample in metric.samples:
        names = tuple(sample.labels)
        line = f"{sample.name}{labels(names, tuple(sample.labels[n] for n in names))} {number(sample.value)}"
        (created if sample.name.endswith("_created") else family).lines.append(line)
    return [family, created] if created.lines else [family]
