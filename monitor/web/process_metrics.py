"""The monitor's own process and build, the families every Prometheus exporter has.

``process_*`` come from prometheus_client's stock ProcessCollector (read from ``/proc`` at each
scrape, never registered globally) and go out through the same lean writer as the rest of
``/metrics``, so there is one exposition and one set of HELP/TYPE lines.
"""

from __future__ import annotations

import platform

from prometheus_client import ProcessCollector

from hangwatch_common.version import version
from monitor.web.exposition import Family, from_client, labels


def build_info() -> Family:
    family = Family("hangwatch_build_info", "1, labelled with the running monitor's version and Python")
    names = ("version", "python_version", "python_implementation")
    family.add(labels(names, (version(), platform.python_version(), platform.python_implementation())), 1.0)
    return family


def process_families(proc: str = "/proc") -> list[Family]:
    """CPU, memory, open files and start time of this process (nothing where ``proc`` is missing)."""
    return [f for m in ProcessCollector(proc=proc, registry=None).collect() for f in from_client(m)]


__all__ = ["build_info", "process_families"]
