"""NCCL's RAS answer, read (pure): the compact per-communicator picture, and this node's part of it.

``parse_status`` turns the JSON answer to ``VERBOSE STATUS`` into a compact dict and copes with
the invalid JSON NCCL 2.28.9 writes for a missing rank. ``local_view`` keeps the ranks of this
node, under the pids the agent knows them by: every node's service answers for the whole job,
so each agent sends only its own ranks and the monitor joins the nodes' parts (the wire stays
small however large the job).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping

# What the agent sends, per node: bounded like every list of monitor/ingest/wire.py.
MAX_COMMUNICATORS = 64
MAX_LOCAL_RANKS = 256
MAX_MISSING_RANKS = 64
MAX_COUNT_KINDS = 16

# ncclResult_t by number, as NCCL's RAS reports a rank's asynchronous error (0: none).
ASYNC_ERRORS = {
    1: "unhandled cuda error",
    2: "system error",
    3: "internal error",
    4: "invalid argument",
    5: "invalid usage",
    6: "remote error",
    7: "in progress",
}

# A value's end, then a new line opening a key: a comma is missing between them. NCCL 2.28.9
# writes exactly that after "nvml_dev" in missing_ranks; no valid JSON has this shape (JSON
# strings hold no raw newline), so adding the comma changes nothing else.
_MISSING_COMMA = re.compile(r'([0-9"\]}el])([ \t]*\r?\n[ \t]*")')


def parse_status(text: str) -> dict:
    """{"nccl_version", "communicators": [...]} from a VERBOSE STATUS answer in JSON.

    Pure. Raises ValueError when the text is not such an answer; odd entries inside one
    (a rank without a number, a count that is not an integer) are left out, not fatal.
    """
    data = _load(text)
    comms = data.get("communicators") if isinstance(data, dict) else None
    if not isinstance(comms, list):
        raise ValueError("no communicators in the answer")
    parsed = [c for c in (_communicator(c) for c in comms) if c is not None]
    return {"nccl_version": _text(data.get("nccl_version"), 64), "communicators": parsed}


def _load(text: str):
    text = text.strip()
    if not text:
        raise ValueError("empty answer")
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(_MISSING_COMMA.sub(r"\1,\2", text))
    except ValueError as e:
        raise ValueError(f"invalid JSON ({e.msg} at line {e.lineno})") from None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value, limit: int = 256) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _entries(value) -> Iterable[dict]:
    return (v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


def _communicator(c) -> dict | None:
    if not isinstance(c, dict):
        return None
    size = _int(c.get("size"))
    if size is None or size < 1:
        return None
    return {
        "hash": _text(c.get("hash"), 64),
        "size": size,
        "ranks_count": _int(c.get("ranks_count")),
        "ranks": [r for r in map(_rank, _entries(c.get("ranks"))) if r is not None],
        "missing_ranks": [m for m in map(_missing_rank, _entries(c.get("missing_ranks"))) if m is not None],
    }


def _rank(r: dict) -> dict | None:
    rank, pid = _int(r.get("rank")), _int(r.get("pid"))
    if rank is None or rank < 0 or pid is None:
        return None
    status = r.get("status") if isinstance(r.get("status"), dict) else {}
    counts = r.get("collective_counts") if isinstance(r.get("collective_counts"), dict) else {}
    code = _int(status.get("async_error")) or 0
    return {
        "rank": rank,
        "pid": pid,
        "host": _text(r.get("host")),
        # Types never launched are left out: a missing type counts as 0 (and the wire stays small).
        "collective_counts": {
            k[:32]: v for k, v in list(counts.items())[:MAX_COUNT_KINDS] if _int(v) is not None and v > 0
        },
        "async_error": None if code == 0 else ASYNC_ERRORS.get(code, f"error {code}"),
        "aborted": status.get("abort_flag") is True,
        "destroyed": status.get("destroy_flag") is True,
        "finalized": status.get("finalize_called") is True,
    }


def _missing_rank(m: dict) -> dict | None:
    rank = _int(m.get("rank"))
    if rank is None or rank < 0:
        return None
    status = m.get("status") if isinstance(m.get("status"), dict) else {}
    return {
        "rank": rank,
        "pid": _int(m.get("pid")),
        "host": _text(m.get("host")),
        "unresponsive": status.get("unresponsive") is True,
        "considered_dead": status.get("considered_dead") is True,
    }


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def local_view(parsed: dict, pids: Mapping[int, int], local_hosts: Collection[str] = ()) -> list[dict]:
    """The communicators that have a rank of this node, with only this node's ranks in them.

    ``pids`` maps the pid a rank has in its own PID namespace (what NCCL reports) to the pid
    the agent knows it by. A rank is this node's when its pid is known and its host is one of
    ``local_hosts`` (or loopback): containers give every node the same small pids. Missing
    ranks are kept whoever they are (few, and no node reports them as its own).
    """

    def local(entry: dict) -> bool:
        if entry.get("pid") not in pids:
            return False
        return not local_hosts or entry["host"] in local_hosts or _is_loopback(entry["host"])

    out = []
    for comm in parsed.get("communicators", []):
        ranks = [dict(r, pid=pids[r["pid"]]) for r in comm["ranks"] if local(r)]
        missing = [dict(m, pid=pids[m["pid"]]) if local(m) else m for m in comm["missing_ranks"]]
        if not ranks and not any(local(m) for m in comm["missing_ranks"]):
            continue
        out.append(dict(comm, ranks=ranks[:MAX_LOCAL_RANKS], missing_ranks=missing[:MAX_MISSING_RANKS]))
    # The widest communicators (the world's first) matter most when there are too many.
    out.sort(key=lambda c: (-c["size"], c["hash"]))
    return out[:MAX_COMMUNICATORS]


def pid_map(own_pids: Iterable[int], inner_pid: Callable[[int], int | None]) -> dict[int, int]:
    """{pid as NCCL reports it: pid as the agent knows it}. A namespace pid two ranks share
    (two containers) names neither: it would attribute one rank's counts to the other."""
    pids = list(own_pids)
    claims: dict[int, set[int]] = {pid: {pid} for pid in pids}
    for pid in pids:
        inner = inner_pid(pid)
        if inner is not None and inner != pid:
            claims.setdefault(inner, set()).add(pid)
    # Decided over all claims at once, so the answer does not depend on the order of pids.
    return {reported: next(iter(owners)) for reported, owners in claims.items() if len(owners) == 1}
