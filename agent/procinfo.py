"""A process's command line and environment from /proc/PID/{cmdline,environ,exe}: thin readers
and pure parsers."""

from __future__ import annotations

import os


def parse_environ(data: bytes) -> dict[str, str]:
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def parse_cmdline(data: bytes) -> list[str]:
    return [a.decode("utf-8", "replace") for a in data.rstrip(b"\0").split(b"\0") if a]


def is_python(exe: str, argv: list[str]) -> bool:
    names = [os.path.basename(exe)] + ([os.path.basename(argv[0])] if argv else [])
    return any(n.startswith("python") for n in names)


def read_argv(proc_root: str, pid: int) -> list[str]:
    """Raises OSError when gone or unreadable; [] for a kernel thread or a zombie."""
    with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
        return parse_cmdline(f.read())


def read_environ(proc_root: str, pid: int) -> dict[str, str]:
    """Raises OSError when gone or not ours to read."""
    with open(f"{proc_root}/{pid}/environ", "rb") as f:
        return parse_environ(f.read())


def read_exe(proc_root: str, pid: int) -> str:
    """The executable's path; "" when unreadable (another user's, or gone)."""
    try:
        return os.readlink(f"{proc_root}/{pid}/exe")
    except OSError:
        return ""
