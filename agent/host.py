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


MAX_INTERFACES = 64
MAX_ADDRESSES = 32


def interface_reports(addrs: dict, stats: dict) -> list[dict]:
    """InterfaceReport dicts from psutil.net_if_addrs() / net_if_stats() shapes (pure).

    Bare IPs, v4 then v6, without the "%scope" suffix of link-local v6 addresses.
    """
    out = []
    for name in sorted(set(addrs) | set(stats)):
        ips: list[str] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for a in addrs.get(name, []):
                if a.family == family and a.address:
                    ip = a.address.split("%", 1)[0]
                    if ip not in ips:
                        ips.append(ip)
        st = stats.get(name)
        out.append({"name": name[:256], "up": bool(st.isup) if st is not None else False, "addresses": ips[:MAX_ADDRESSES]})
    return out[:MAX_INTERFACES]


def collect_interfaces() -> list[dict]:
    """The node's interfaces: the agent's own network namespace is the node's."""
    import psutil  # noqa: PLC0415 -- only here: the rest of the agent reads /proc itself

    return interface_reports(psutil.net_if_addrs(), psutil.net_if_stats())
