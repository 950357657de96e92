"""A small real volume for tests of what happens when a disk fills: a tmpfs of a given size,
mounted for the test (the tests run as root) and unmounted after, also when the test fails."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``path`` (made here) as a tmpfs of ``size`` ("2m") for the ``with`` block."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True, timeout=30)
    try:
        yield path
    finally:
        # Lazy: a file a failed test left open does not keep the mount (or the next test) stuck.
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)
