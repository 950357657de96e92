"""The installed hangwatch version, for --version and hangwatch_build_info."""

from __future__ import annotations

import platform
from functools import cache
from importlib import metadata


@cache
def version() -> str:
    try:
        return metadata.version("hangwatch")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def version_line(program: str) -> str:
    """What ``PROGRAM --version`` prints."""
    return f"{program} {version()} (Python {platform.python_version()})"
