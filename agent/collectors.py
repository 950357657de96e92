"""The collector registry (node_exporter's shape): each collector registers its name, whether it is
on by default and a factory; the agent builds the enabled ones and runs them in registration order
once a tick, each timed and contained, its health published with the report."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

log = logging.getLogger(__name__)

MAX_ERROR = 2048  # the monitor's LineStr


class NotDue(Exception):
    """Raised by a collector with nothing to do this tick (its interval not yet up): no health entry."""


class Collector(Protocol):
    def collect(self, tick: Any) -> str | None:
        """Collect this tick's signals; return a problem met on the way (the rest still collected:
        ranks that denied a read), or None. Raise when nothing could be collected."""


@dataclass(frozen=True)
class Registration:
    name: str
    # Given the agent, the collector; called once, when the agent is built.
    factory: Callable[[Any], Collector]
    default: bool = True


@dataclass
class Health:
    """Each collector's last run: ok, its error, its duration (the report's ``collectors`` list)."""

    entries: dict[str, dict] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic

    def run(self, name: str, work: Callable[[], str | None]) -> None:
        started = self.clock()
        try:
            problem = work()
        except NotDue:
            return
        except Exception as e:  # noqa: BLE001 -- one collector must never stop the others
            log.debug("collector %s failed", name, exc_info=True)
            problem = f"{type(e).__name__}: {e}"
        # A name run again (the stack dumps of --once) keeps its place in the list.
        self.entries[name] = {"name": name, "ok": not problem, "error": problem[:MAX_ERROR] if problem else None,
                              "duration_s": round(self.clock() - started, 4)}

    def report(self) -> list[dict]:
        return list(self.entries.values())


@dataclass(frozen=True)
class Collectors:
    """The enabled collectors, built, in the order a tick runs them."""

    built: tuple[tuple[str, Collector], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.built]

    def run(self, tick: Any) -> Health:
        health = Health()
        for name, collector in self.built:
            health.run(name, partial(collector.collect, tick))
        return health


class Registry:
    """Collectors by name, in registration order: later ones may read what earlier ones found."""

    def __init__(self) -> None:
        self._registrations: dict[str, Registration] = {}

    def register(self, name: str, factory: Callable[[Any], Collector], *, default: bool = True) -> None:
        if name in self._registrations:
            raise ValueError(f"collector {name!r} is registered twice")
        self._registrations[name] = Registration(name, factory, default)

    def defaults(self) -> dict[str, bool]:
        """Each collector's name and whether it runs unless told otherwise."""
        return {r.name: r.default for r in self._registrations.values()}

    def build(self, agent: Any, enabled: Mapping[str, bool] | None = None) -> Collectors:
        """The collectors ``enabled`` turns on or off by name (the others as registered; a name not
        registered here is no collector of this registry's, and ignored)."""
        enabled = enabled or {}
        return Collectors(tuple(
            (r.name, r.factory(agent)) for r in self._registrations.values() if enabled.get(r.name, r.default)
        ))
