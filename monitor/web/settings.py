"""Monitor settings: built once at start-up from defaults, ``HANGWATCH_*`` and the command line.

Every value is checked here, so a bad option fails at start with one clear line
instead of surfacing later as a traceback inside a request.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "HANGWATCH_"
MIN_STRAGGLER_WINDOW_S = 6.0
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


class SettingsError(ValueError):
    """A setting that cannot work; the message is one line meant for a person, and names the
    setting as the person gave it (``HANGWATCH_PORT``, ``--port``) when Settings.load knows where
    it came from."""


def _named_as(sources: Mapping[str, str]) -> Callable[[str], str]:
    """A setting's name in messages: where its value came from, else its own name."""
    return lambda name: sources.get(name, name)


def default_db_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("HANGWATCH_STATE_DIR"):
        return Path(env["HANGWATCH_STATE_DIR"]) / "monitor.db"
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "hangwatch" / "monitor.db"
    return Path.home() / ".local" / "state" / "hangwatch" / "monitor.db"


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8787
    db: Path = field(default_factory=default_db_path)
    # Bodies above this are refused with 413 (checked on Content-Length and while streaming).
    max_body_bytes: int = 8 * 1024 * 1024
    # A node's full report is stored (and asked of delta agents) at most this often; a
    # restart replays the newest snapshots of each node.
    snapshot_interval_s: float = 60.0
    # Snapshots older than this are pruned; so are all but the newest few per node.
    snapshot_retention_s: float = 900.0
    snapshots_per_node: int = 3
    # A snapshot larger than this (compressed) is not kept; all of them take at most the budget, past
    # which only nodes that have one may replace theirs (monitor/storage/store.py).
    snapshot_max_bytes: int = 1024 * 1024
    snapshot_budget_bytes: int = 1024 * 1024 * 1024
    # Verdict changes (each job's history) are kept this long.
    verdict_retention_s: float = 30 * 86400.0
    # Suspect nodes (named as culprits in incidents of several jobs) are counted over this window
    # for /metrics and the drain-candidate alert (monitor/engine/incidents.py); at most the retention.
    suspect_window_s: float = 7 * 86400.0
    # A read (/diagnose, /metrics) re-diagnoses the jobs that changed since the last pass
    # only while they hold at most this many ranks in all; past that it answers from the
    # pass of the background tick (at most one tick old), so reads cost the same at any scale.
    fresh_read_ranks: int = 512
    # When the event loop runs this far behind, reports from nodes the monitor heard from
    # within shed_keep_s are refused with 503 and Retry-After: the newest report per node
    # wins, every node's picture stays fresh within a few seconds, diagnosis goes on.
    shed_lag_s: float = 0.5
    shed_keep_s: float = 5.0
    # Jobs whose ranks all ended, or that no agent mentions any more, are forgotten after this.
    job_retention_s: float = 600.0
    # Background diagnosis that records verdict changes; 0 turns it off (tests drive it by hand).
    tick_interval_s: float = 1.0
    # The half-minute over which each rank's CPU level is taken to name a rank that sets a stepping
    # job's pace (monitor/diagnosis/slow_rank.py): longer is steadier, shorter names it sooner.
    straggler_window_s: float = 30.0
    # Publish an alarm only once its raw verdicts have lasted (monitor/diagnosis/stability.py).
    # Off (false), every single reading is published: for tests of one reading, not for paging.
    confirm_alarms: bool = True
    log_level: str = "info"
    # Opt-in actions on verdicts (monitor/engine/actions/config.py); None: the monitor never acts.
    actions_file: Path | None = None
    # Evidence captured per incident (monitor/storage/capture_store.py): asked of the job's agents once its
    # verdict held this long (0: never); kept in capture_dir (default: captures/ beside the
    # database), at most capture_max_bytes in all and capture_retention_s old.
    capture_after_s: float = 15.0
    capture_dir: Path | None = None
    capture_max_bytes: int = 4 * 1024 * 1024 * 1024
    capture_retention_s: float = 7 * 86400.0
    # What one monitor takes in (monitor/ingest/limits.py): reports past these are refused (429, 422).
    max_jobs: int = 2000
    max_jobs_per_node: int = 64
    # At max_jobs, a job no agent mentioned for this long gives its place to a new one.
    job_room_silent_s: float = 60.0
    max_ranks: int = 100_000
    max_nodes: int = 10000
    # What jobs and nodes silent for job_room_silent_s keep (their reports, estimated), all together:
    # past it the densest is forgotten first (monitor/ingest/silent_budget.py), so junk sent once under new
    # node names cannot hold the monitor's memory for the job retention.
    max_silent_bytes: int = 256 * 1024 * 1024
    max_world_size: int = 65536
    # Connection guards (monitor/web/http_guard.py): open connections at most (kept under the open-file
    # limit), and how long a client may take over a request's headers and over its body.
    max_connections: int = 4096
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # A request's head (request line and headers): larger, or with more headers, is answered 431.
    max_header_bytes: int = 32 * 1024
    max_headers: int = 64
    # Token files (monitor/web/auth.py); a kind of request whose file is not set is open.
    # Agents' reports: lines "TOKEN" (any node) or "NODE TOKEN" (that node only).
    token_file: Path | None = None
    # The page, /diagnose and /api/...: people and their tools.
    read_token_file: Path | None = None
    # /metrics, for Prometheus's authorization setting.
    metrics_token_file: Path | None = None
    # Relays' batches (monitor/relay/); without it, an ingest token bound to no node, vouching for nothing.
    relay_token_file: Path | None = None
    # TLS: served over HTTPS when both are set (uvicorn's certificate options).
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    # Links on the status page: a Grafana dashboard ("{job}" is replaced by the job's id) and the
    # runbook (docs/runbook.md where people can read it; the page adds each verdict's #section).
    grafana_url: str | None = None
    runbook_url: str | None = None

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
        option_names: Mapping[str, str] | None = None,
    ) -> Settings:
        """Defaults, then ``HANGWATCH_<NAME>`` variables, then ``overrides`` (None values skipped).

        ``option_names``: setting -> the command-line option that gives it (``--port``), so that
        an error names what the person typed; a value from a variable is named by the variable.
        """
        env = os.environ if env is None else env
        raw: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            key = ENV_PREFIX + f.name.upper()
            if key in env and env[key] != "":
                raw[f.name] = env[key]
                sources[f.name] = key
        if "db" not in raw:
            raw["db"] = default_db_path(env)
        for name, value in (overrides or {}).items():
            if value is not None:
                raw[name] = value
                sources[name] = (option_names or {}).get(name, name)
        return cls.from_raw(raw, sources)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Settings:
        """``sources``: setting -> where its value came from, for error messages."""
        named = _named_as(sources or {})
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for name, value in raw.items():
            if name not in known:
                raise SettingsError(f"unknown setting {name!r}")
            values[name] = _convert(named(name), value, known[name].type)
        settings = cls(**values)
        settings.validate(named)
        return settings

    def validate(self, named: Callable[[str], str] = str) -> None:
        """``named(setting)``: how a message names the setting (the variable or option it came from)."""
        if not self.host:
            raise SettingsError(f"{named('host')} must not be empty")
        if not 1 <= self.port <= 65535:
            raise SettingsError(f"{named('port')} must be between 1 and 65535, not {self.port}")
        for name in ("max_body_bytes", "max_header_bytes", "snapshot_max_bytes", "snapshot_budget_bytes",
                     "max_silent_bytes"):
            if getattr(self, name) < 1024:
                raise SettingsError(f"{named(name)} must be at least 1024, not {getattr(self, name)}")
        if self.suspect_window_s > self.verdict_retention_s:
            raise SettingsError(f"{named('suspect_window_s')} ({self.suspect_window_s:g} s) must not be longer "
                                f"than {named('verdict_retention_s')} ({self.verdict_retention_s:g} s): the "
                                "incidents it counts are read from the verdict history")
        for name in ("snapshot_interval_s", "snapshot_retention_s", "verdict_retention_s", "suspect_window_s",
                     "job_retention_s", "capture_retention_s", "capture_max_bytes",
                     "shed_lag_s", "shed_keep_s", "header_timeout_s", "body_timeout_s", "job_room_silent_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{named(name)} must be positive, not {getattr(self, name):g}")
        if self.straggler_window_s < MIN_STRAGGLER_WINDOW_S:
            raise SettingsError(f"{named('straggler_window_s')} must be at least {MIN_STRAGGLER_WINDOW_S:g} s "
                                f"(levels are medians of one report a second), not {self.straggler_window_s:g}")
        for name in ("max_jobs", "max_jobs_per_node", "max_ranks", "max_nodes", "max_world_size", "max_connections", "snapshots_per_node", "max_headers"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{named(name)} must be at least 1, not {getattr(self, name)}")
        for name in ("fresh_read_ranks", "tick_interval_s", "capture_after_s"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{named(name)} must not be negative, not {getattr(self, name):g}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise SettingsError(f"{named('ssl_certfile')} and {named('ssl_keyfile')} go together: "
                                "set both or neither")
        for name in ("ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not os.access(path, os.R_OK):
                raise SettingsError(f"{named(name)} {path} is not readable")
        for name in ("grafana_url", "runbook_url"):
            url = getattr(self, name)
            # Only web addresses: the page puts them in links, where javascript: would run.
            if url is not None and not url.lower().startswith(("http://", "https://")):
                raise SettingsError(f"{named(name)} must be an http:// or https:// address, not {url[:64]!r}")
        if self.actions_file is not None:
            from monitor.engine.actions.config import ActionConfigError, load_actions  # only when acting

            try:
                load_actions(self.actions_file)
            except ActionConfigError as exc:
                raise SettingsError(f"{named('actions_file')}: {exc}") from None
        if self.log_level not in LOG_LEVELS:
            raise SettingsError(f"{named('log_level')} must be one of {', '.join(LOG_LEVELS)}, "
                                f"not {self.log_level!r}")

    def prepare_db_dir(self) -> str | None:
        """Create the database's directory and check it can be written, before serving.

        A path that cannot be a database (a directory, a file where a directory must be) is a
        SettingsError. A disk that cannot take writes now (read-only, full, no permission) is not:
        the monitor serves with its history in memory (monitor/storage/store.py) rather than exit into a
        restart loop; the problem is returned, for the log.
        """
        path = self.db
        if path.exists() and path.is_dir():
            raise SettingsError(f"database path {path} is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.EEXIST):
                raise SettingsError(f"cannot create database directory {path.parent}: "
                                    f"{exc.strerror or exc}") from None
            return f"cannot create database directory {path.parent}: {exc.strerror or exc}"
        # WAL needs to create -wal/-shm files beside the database, so the directory must be writable.
        if not os.access(path.parent, os.W_OK | os.X_OK):
            return f"database directory {path.parent} is not writable"
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            return f"database file {path} is not readable and writable"
        try:
            sqlite3.connect(path).close()
        except sqlite3.Error as exc:
            return f"cannot open database {path}: {exc}"
        return None


def _convert(name: str, value: Any, type_name: Any) -> Any:
    kind = type_name if isinstance(type_name, str) else getattr(type_name, "__name__", str(type_name))
    kind = kind.removesuffix(" | None")
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            number = float(value)
            if number != number:  # NaN passes every comparison in validate()
                raise ValueError
            return number
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError
            return text in ("1", "true", "yes", "on")
        if kind == "Path":
            return Path(value).expanduser()
        return str(value)
    except (TypeError, ValueError):
        what = {"int": "a whole number", "float": "a number", "bool": "one of 1, 0, true, false, yes, no, on, off"}
        raise SettingsError(f"{name} must be {what.get(kind, 'a ' + kind)}, not {str(value)[:64]!r}") from None
