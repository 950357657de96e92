"""A fake /proc for discovery tests: the files Discovery reads, written as the kernel shows them."""

from __future__ import annotations

import os
from pathlib import Path


def fake_process(root: Path, pid: int, ppid: int, argv: list[str], env: dict[str, str], starttime: int = 1000) -> None:
    """Process ``pid`` under ``root`` (written again if it exists: an exec keeps pid and start time)."""
    base = root / str(pid)
    base.mkdir(exist_ok=True)
    # Fields 3.. of proc(5) stat: state, ppid, ..., starttime is field 22.
    fields = ["S", str(ppid)] + ["0"] * 48
    fields[22 - 3] = str(starttime)
    (base / "stat").write_text(f"{pid} ({os.path.basename(argv[1] if len(argv) > 1 else argv[0])[:15]}) "
                               + " ".join(fields) + "\n")
    (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (base / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    if not (base / "exe").is_symlink():
        os.symlink("/usr/bin/python3", base / "exe")
