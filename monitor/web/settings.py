"""Monitor settings: built once at start-up from defaults, the config file, ``HANGWATCH_*`` and the
command line.

Each setting is declared once, below (hangwatch_common/settings.py makes its flag, variable and
``--help`` entry from it); the limits on what one monitor takes in are declared with the checks
that apply them (monitor/ingest/limits.py). Every value is checked here, so a bad option fails at
start with one clear line instead of surfacing later as a traceback inside a request.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hangwatch_common.settings import PREFIX, DaemonSettings, SettingsError, build, gather, setting
from monitor.engine.engine_settings import MIN_STRAGGLER_WINDOW_S, EngineSettings
from monitor.storage.store import StoreSettings
from monitor.web.http_guard import ConnectionLimits
from monitor.web.load import ShedSettings
from monitor.web.runbook import RUNBOOK_PATH
from monitor.storage.capture_store import MAX_TOTAL_BYTES as CAPTURE_MAX_BYTES, RETENTION_S as CAPTURE_RETENTION_S

ENV_PREFIX = PREFIX


def _named_as(sources: Mapping[str, str]) -> Callable[[str], str]:
    """A setting's name in messages: where its value came from, else its own name."""
    return lambda name: sources.get(name, name)


def default_db_path(env: Mapping[str, str] | None = None, state_dir: str | Path | None = None) -> Path:
    """The database when --db is not given: monitor.db in the state directory (--state-dir), else the XDG one."""
    env = os.environ if env is None else env
    if state_dir:
        return Path(state_dir) / "monitor.db"
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "hangwatch" / "monitor.db"
    return Path.home() / ".local" / "state" / "hangwatch" / "monitor.db"


def _web_address(text: str) -> str:
    # Only web addresses, or a path on this monitor (its own /runbook): the page puts them in links,
    # where javascript: would run; and a browser reads "//host" or "/\host" (once it drops tabs and
    # newlines) as another site.
    if not (text.lower().startswith(("http://", "https://")) or re.fullmatch(r"/(?![/\\])[^\x00-\x20\x7f\\]*", text)):
        raise ValueError("must be an http:// or https:// address, or a path on this monitor such as /runbook")
    return text


@dataclass(frozen=True)
class Settings(EngineSettings, StoreSettings, ConnectionLimits, ShedSettings, DaemonSettings):
    config_table: ClassVar[str] = "monitor"
    host: str = setting("127.0.0.1", help="address to listen on")
    port: int = setting(8787, help="port to listen on", at_least=1, at_most=65535)
    state_dir: Path | None = setting(None, help="the directory of the default database (monitor.db in it)",
                                     metavar="DIR", shown_default="$XDG_STATE_HOME/hangwatch, else ~/.local/state/hangwatch")
    db: Path = setting(factory=default_db_path, help="the SQLite file of the monitor's history",
                       shown_default="monitor.db in the state directory")
    # Bodies above this are refused with 413 (checked on Content-Length and while streaming).
    max_body_bytes: int = setting(8 * 1024 * 1024, help="largest accepted report (413 past it)", at_least=1024)
    # monitor/engine/actions/config.py
    actions_file: Path | None = setting(None, aliases=("--actions",), help="opt-in actions on verdicts: a TOML file of "
                                        "rules (command, webhook, or signals the agents send); dry run unless it says "
                                        "dry_run = false (docs/runbook.md, Acting on verdicts); unset: never acts")
    # monitor/storage/capture_store.py
    capture_after_s: float = setting(15.0, help="seconds an incident's verdict holds before its agents are asked for a "
                                     "capture (native stacks, Flight Recorder, NCCL RAS, log tails); 0: never",
                                     at_least=0)
    capture_dir: Path | None = setting(None, metavar="DIR", help="where capture bundles are kept",
                                       shown_default="captures/ beside the database")
    capture_max_bytes: int = setting(CAPTURE_MAX_BYTES, help="all capture bundles together at most", positive=True)
    capture_retention_s: float = setting(CAPTURE_RETENTION_S, help="seconds a capture bundle is kept", positive=True)
    # Token files (monitor/web/auth.py); a kind of request whose file is not set is open.
    token_file: Path | None = setting(None, help="agents' tokens, one per line: TOKEN, or NODE TOKEN to bind it to a "
                                      "node; unset: reports are not authenticated")
    read_token_file: Path | None = setting(None, help="tokens for the page, /diagnose and /api; unset: reads are open")
    metrics_token_file: Path | None = setting(None, help="tokens for /metrics (Prometheus's authorization setting); "
                                              "unset: /metrics is open")
    # Without it, a relay's token is an ingest token bound to no node, vouching for nothing.
    relay_token_file: Path | None = setting(None, help="tokens of relays (hangwatch-relay), whose checks of node-bound "
                                            "agent tokens the monitor then believes")
    ssl_certfile: Path | None = setting(None, help="serve HTTPS with this certificate (PEM; with --ssl-keyfile)")
    ssl_keyfile: Path | None = setting(None, help="the certificate's private key (PEM)")
    grafana_url: str | None = setting(None, parse=_web_address, help="a Grafana dashboard linked from the status "
                                      "page; {job} in it is replaced by the job's id")
    runbook_url: str = setting(RUNBOOK_PATH, parse=_web_address, help="the runbook linked from the status page, "
                               "each verdict to its section (#deadlock ...)",
                               shown_default=f"{RUNBOOK_PATH}, this monitor's own copy of docs/runbook.md")

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
        option_names: Mapping[str, str] | None = None,
    ) -> Settings:
        """Defaults, then the config file (``config``), then ``HANGWATCH_<NAME>`` variables, then
        ``overrides`` (None values skipped).

        ``option_names``: setting -> the command-line option that gives it (``--port``), so that
        an error names what the person typed; a value from a variable is named by the variable.
        """
        env = os.environ if env is None else env
        raw, sources = gather(cls, overrides or {}, env, option_names)
        if "db" not in raw:
            raw["db"] = default_db_path(env, raw.get("state_dir"))
        return cls.from_raw(raw, sources)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Settings:
        """``sources``: setting -> where its value came from, for error messages."""
        settings = build(cls, raw, sources)
        settings.validate(_named_as(sources or {}))
        return settings

    def validate(self, named: Callable[[str], str] = str) -> None:
        """What one setting's bounds cannot say (its declaration checks those).
        ``named(setting)``: how a message names the setting (the variable or option it came from)."""
        if not self.host:
            raise SettingsError(f"{named('host')} must not be empty")
        if self.suspect_window_s > self.verdict_retention_s:
            raise SettingsError(f"{named('suspect_window_s')} ({self.suspect_window_s:g} s) must not be longer "
                                f"than {named('verdict_retention_s')} ({self.verdict_retention_s:g} s): the "
                                "incidents it counts are read from the verdict history")
        if self.straggler_window_s < MIN_STRAGGLER_WINDOW_S:
            raise SettingsError(f"{named('straggler_window_s')} must be at least {MIN_STRAGGLER_WINDOW_S:g} s "
                                f"(levels are medians of one report a second), not {self.straggler_window_s:g}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise SettingsError(f"{named('ssl_certfile')} and {named('ssl_keyfile')} go together: "
                                "set both or neither")
        for name in ("ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not os.access(path, os.R_OK):
                raise SettingsError(f"{named(name)} {path} is not readable")
        if self.actions_file is not None:
            from monitor.engine.actions.config import ActionConfigError, load_actions  # only when acting

            try:
                load_actions(self.actions_file)
            except ActionConfigError as exc:
                raise SettingsError(f"{named('actions_file')}: {exc}") from None

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

