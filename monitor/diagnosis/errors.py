"""Known error messages and what to do about them (from the seeds and the field)."""

from __future__ import annotations

import re
from collections.abc import Iterable

KNOWN_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"getFuture not implemented|Work::getFuture", re.IGNORECASE),
     "gloo does not implement Work.get_future() (NCCL does): on gloo call work.wait() instead, e.g. "
     "a wrapper that tries get_future() and falls back to an object whose wait() calls work.wait()."),
    (re.compile(r"EADDRINUSE|address already in use|failed to listen on any local network address",
                re.IGNORECASE),
     "The master port is already taken, usually by processes of an earlier run: find them with "
     "`ss -tlnp | grep PORT` and end them by PID, or launch with another --master-port."),
    (re.compile(r"Unable to find address for|no device named|Cannot assign requested address|"
                r"Network is unreachable|No route to host", re.IGNORECASE),
     "GLOO_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME) names an interface that does not exist or has no usable "
     "address on that node: set it to the NIC that joins the nodes (see `ip -br addr`)."),
    (re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE),
     "A rank ran out of memory: reduce the batch size or sequence length on that rank, and check "
     "for memory that only some ranks allocate (rank-0-only metrics or logging)."),
    (re.compile(r"Watchdog caught collective operation timeout|Timed out waiting|NCCL timeout|"
                r"timed out after", re.IGNORECASE),
     "A collective timed out: the ranks were hung before this error; the cause is the rank that "
     "stopped calling collectives first (uneven data, rank-conditional collectives, a dead peer)."),
    (re.compile(r"invalid device ordinal", re.IGNORECASE),
     "Let torchrun assign GPUs (LOCAL_RANK) and do not set CUDA_VISIBLE_DEVICES per rank by hand."),
)


def hints_for_errors(texts: Iterable[str | None]) -> list[str]:
    hints: list[str] = []
    for text in texts:
        if not text:
            continue
        for pattern, hint in KNOWN_ERRORS:
            if pattern.search(text) and hint not in hints:
                hints.append(hint)
    return hints
