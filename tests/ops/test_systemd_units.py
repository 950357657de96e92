"""deploy/systemd: systemd's own verifier and security analyser on the units, and the settings
files they read checked by the agent's and monitor's own parsers."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from agent.cli import parse_config
from hangwatch.demo.harness import tool
from monitor.relay.cli import load_settings as relay_settings
from monitor.web.settings import Settings

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"
# systemd-analyze security's exposure scale: 0 (locked down) to 10 (none). The agent keeps
# ptrace, /proc and /tmp visible on purpose; the monitor needs none of it.
MAX_EXPOSURE = {"hangwatch-agent.service": 4.5, "hangwatch-monitor.service": 1.5, "hangwatch-relay.service": 1.5}


def directives(path: Path) -> dict[str, list[str]]:
    """key -> values (in order; keys such as SystemCallFilter may repeat), all sections merged."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


@pytest.fixture
def units_here(tmp_path: Path) -> Path:
    """Copies of the units whose ExecStart points at this environment's scripts: verify needs the
    binaries to exist (the shipped units use /usr/local/bin)."""
    bindir = str(Path(tool("hangwatch-agent")).parent) + "/"
    for unit in UNITS.glob("*.service"):
        text = unit.read_text()
        assert "ExecStart=/usr/local/bin/" in text
        (tmp_path / unit.name).write_text(text.replace("/usr/local/bin/", bindir))
    return tmp_path


def verify(*units: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", *map(str, units)], capture_output=True, text=True,
                          cwd=units[0].parent)


def test_systemd_analyze_verify(units_here: Path) -> None:
    units = sorted(units_here.glob("*.service"))
    assert [u.name for u in units] == ["hangwatch-agent.service", "hangwatch-monitor.service",
                                       "hangwatch-relay.service"]
    result = verify(*units)
    # verify exits 0 on warnings (unknown keys, unparsable values): require it to say nothing.
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        f"rc={result.returncode}\n{result.stdout}{result.stderr}")


def test_verifier_catches_mistakes(units_here: Path) -> None:
    """The check above is not vacuous: a typo or a bad value makes verify speak."""
    unit = units_here / "hangwatch-agent.service"
    unit.write_text(unit.read_text().replace("WatchdogSec=30s", "WatchdogSec=thirty\nRestartt=always"))
    result = verify(unit)
    assert "Unknown key" in result.stderr and "Failed to parse" in result.stderr, result.stderr


@pytest.mark.parametrize("name", sorted(MAX_EXPOSURE))
def test_security_exposure(units_here: Path, name: str) -> None:
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager",
                             f"--threshold={int(MAX_EXPOSURE[name] * 10)}", name],
                            capture_output=True, text=True, cwd=units_here)
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert level, result.stdout + result.stderr
    assert float(level.group(1)) <= MAX_EXPOSURE[name] and result.returncode == 0, result.stdout[-2000:]


@pytest.mark.parametrize("name", ["hangwatch-agent.service", "hangwatch-monitor.service", "hangwatch-relay.service"])
def test_notify_watchdog_restart_envfile(name: str) -> None:
    d = directives(UNITS / name)
    assert d["Type"] == ["notify"]
    assert d["NotifyAccess"] == ["main"]
    assert re.fullmatch(r"\d+s", d["WatchdogSec"][0])
    assert d["Restart"] == ["on-failure"]
    short = name.removeprefix("hangwatch-").removesuffix(".service")
    assert d["EnvironmentFile"] == [f"-/etc/hangwatch/{short}.env"]
    assert (UNITS / f"{short}.env.example").exists()
    assert d["ExecStart"][0].startswith(f"/usr/local/bin/hangwatch-{short}")
    assert d["WantedBy"] == ["multi-user.target"]


def test_agent_may_ptrace() -> None:
    d = directives(UNITS / "hangwatch-agent.service")
    for key in ("AmbientCapabilities", "CapabilityBoundingSet"):
        assert "CAP_SYS_PTRACE" in d[key][0].split(), key
    filters = " ".join(d["SystemCallFilter"]).split()
    assert "@debug" in filters and "@system-service" in filters
    assert not any(f.startswith("~") for f in filters)
    # Each of these would hide the ranks from the agent or take ptrace away.
    assert "PrivateUsers" not in d and "DynamicUser" not in d and "User" not in d
    assert d.get("ProtectProc", ["default"]) != ["invisible"] and "ProcSubset" not in d
    assert "PrivateTmp" not in d and "PrivatePIDs" not in d


def test_agent_env_example_makes_a_valid_command_line() -> None:
    """Expand ExecStart as systemd would (${X}: one word, $X: split on spaces) with the example's
    values, then parse it with the agent's own parser."""
    d = directives(UNITS / "hangwatch-agent.service")
    env = dict(v.split("=", 1) for v in d["Environment"])
    env.update(env_file(UNITS / "agent.env.example"))
    argv: list[str] = []
    for word in shlex.split(d["ExecStart"][0])[1:]:
        if m := re.fullmatch(r"\$\{(\w+)\}", word):
            argv.append(env[m.group(1)])
        elif m := re.fullmatch(r"\$(\w+)", word):
            argv.extend(env[m.group(1)].split())
        else:
            argv.append(word)
    config, _ = parse_config(argv)
    assert config.monitor == "http://monitor.example.internal:8787"
    assert config.interval == 1.0


def test_monitor_env_example_is_valid_settings() -> None:
    d = directives(UNITS / "hangwatch-monitor.service")
    env = dict(v.split("=", 1) for v in d["Environment"])
    env.update(env_file(UNITS / "monitor.env.example"))
    settings = Settings.load(env=env)
    assert (settings.host, settings.port) == ("0.0.0.0", 8787)
    assert settings.db == Path("/var/lib/hangwatch/monitor.db")
    assert d["StateDirectory"] == ["hangwatch"]


def test_relay_env_example_is_a_valid_relay_command_line() -> None:
    """The relay takes its settings from HANGWATCH_* variables (an empty command line)."""
    args = relay_settings([], env=env_file(UNITS / "relay.env.example"))
    assert args.monitor == "http://monitor.example.internal:8787"
    assert (args.host, args.port) == ("0.0.0.0", 8788)
    assert args.token_file == "/etc/hangwatch/agents.tokens" and args.relay_token_file == "/etc/hangwatch/relay.token"


def _commands_beside(path: Path, variable: str) -> list[str]:
    """The commands in the comment block right above ``variable=`` in an example file."""
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{variable}="))
    block: list[str] = []
    for line in reversed(lines[:at]):
        if not line.startswith("#"):
            break
        block.insert(0, line)
    return [line[1:].strip() for line in block if line.startswith("#   ")]


@pytest.mark.live
def test_monitor_env_example_starts_once_its_comments_are_followed(tmp_path: Path) -> None:
    """As shipped the example names a token file that does not exist: the monitor refuses to start
    (fails closed). Run the commands its comment gives (under tmp_path, without the user they chown
    to), and the real monitor starts with the example's settings."""
    from hangwatch.demo.harness import Reaper, free_port, start_monitor

    example = UNITS / "monitor.env.example"
    root = tmp_path / "etc-hangwatch"
    env = {k: v.replace("/etc/hangwatch", str(root)) for k, v in env_file(example).items()}
    env["HANGWATCH_STATE_DIR"] = str(tmp_path / "state")
    missing = subprocess.run([tool("hangwatch-monitor"), "--host", "127.0.0.1", "--port", str(free_port())], env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and env["HANGWATCH_TOKEN_FILE"] in missing.stderr, missing.stderr

    commands = _commands_beside(example, "HANGWATCH_TOKEN_FILE")
    assert any(c.startswith("useradd") for c in commands) and any(c.startswith("install -m 0600") for c in commands)
    script = "\n".join(c.replace("/etc/hangwatch", str(root)).replace(" -o hangwatch -g hangwatch", "")
                       for c in commands if not c.startswith("useradd"))
    subprocess.run(["bash", "-euc", script], check=True, timeout=30)
    assert (root / "agents.tokens").stat().st_mode & 0o777 == 0o600

    reaper = Reaper()
    try:
        monitor = start_monitor(reaper, tmp_path, settings=env)
        assert monitor.proc.poll() is None
    finally:
        reaper.close()
