"""Host facts: name, CPU count, CPU model and the flags that matter for bf16 speed."""

from __future__ import annotations

import os
import socket

INTERESTING_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


def parse_cpuinfo(text: str) -> tuple[str, list[str]]:
    """(model name, interesting flags present) from the first processor block."""
    model, flags = "", []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            present = set(value.split())
            flags = [f for f in INTERESTING_FLAGS if f in present]
        if model and flags:
            break
    return model, flags


def collect_host(proc_root: str = "/proc") -> dict:
    try:
        with open(f"{proc_root}/cpuinfo") as f:
            model, flags = parse_cpuinfo(f.read())
    except OSError:
        model, flags = "", []
    return {
        "hostname": socket.gethostname()[:256],
        "cpu_count": os.cpu_count(),
        "cpu_model": model[:256],
        "cpu_flags": flags,
    }
