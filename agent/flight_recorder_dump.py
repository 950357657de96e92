"""A PyTorch Flight Recorder dump, read (pure): per process group, how far the rank got.

torch records every collective of every process group in a ring buffer (NCCL, and gloo too
since torch 2.13) and dumps it as a pickle of plain dicts and lists (``_dump_fr_trace()``, the
file NCCL's watchdog writes on a timeout) or as JSON (``_dump_fr_trace_json()``). Real content
(torch 2.13, gloo)::

    {"version": "2.10", "comm_lib_version": "", "pg_config": {"": {"name": "", "desc": "",
     "ranks": "[0, 1]"}}, "pg_status": {"0": {"last_enqueued_collective": 41,
     "last_started_collective": -1, "last_completed_collective": 40}},
     "entries": [{"record_id": 40, "pg_id": 0, "process_group": ("0", "default_pg"),
                  "collective_seq_id": 41, "p2p_seq_id": 0, "profiling_name": "gloo:all_reduce",
                  "state": "scheduled", "time_created_ns": 1795443963297413968,
                  "is_p2p": False, "frames": [...], ...}, ...]}

The JSON form has the same keys, its pg_status numbers as strings. Only plain data is ever
unpickled: a dump that names a class or function (``os.system``) is refused, not loaded.
"""

from __future__ import annotations

import io
import json
import pickle

MAX_GROUPS = 32
RECENT_PER_GROUP = 4
STATUS_FIELDS = (
    ("last_enqueued", "last_enqueued_collective"),
    ("last_started", "last_started_collective"),
    ("last_completed", "last_completed_collective"),
)
# profiling_name is "<backend>:<collective>" ("nccl:all_reduce", "gloo:broadcast").
BACKEND_PREFIXES = ("nccl:", "gloo:", "xccl:", "ucc:", "mpi:")


class Refused(pickle.UnpicklingError):
    """The pickle names a class or function: not a dump, and never loaded."""


class _PlainDataOnly(pickle.Unpickler):
    """Unpickles lists, dicts, tuples, strings and numbers; refuses every class and function,
    which is how a pickle runs code (a dump is the job's data, not trusted code)."""

    def find_class(self, module: str, name: str):
        # The names stay out of the message: it is reported, and the file may be anyone's.
        raise Refused("refused a reference to a class or function (a dump holds plain data only)")


def load(data: bytes) -> dict:
    """The dump as plain data, pickle or JSON. Raises ValueError saying why it cannot be read."""
    head = data.lstrip()[:1]
    if not head:
        raise ValueError("empty file")
    try:
        if head == b"{":
            dump = json.loads(data.decode("utf-8"))
        else:
            dump = _PlainDataOnly(io.BytesIO(data)).load()
    except Refused as e:
        raise ValueError(str(e)[:200]) from None
    except (EOFError, pickle.UnpicklingError) as e:
        if isinstance(e, EOFError) or "truncated" in str(e):
            raise ValueError("truncated (a dump still being written, or cut short)") from None
        # Fixed words, not the parser's: its messages quote the file's bytes.
        raise ValueError(f"not a Flight Recorder dump ({type(e).__name__})") from None
    except Exception as e:  # noqa: BLE001 -- garbage makes pickle raise almost anything
        raise ValueError(f"not a Flight Recorder dump ({type(e).__name__})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_status", {}), dict):
        raise ValueError("not a Flight Recorder dump (no pg_status)")
    return dump


def parse_dump(data: bytes) -> dict:
    """{"version", "groups": [...]} from a dump file's bytes (see ``summarize``)."""
    return summarize(load(data))


def summarize(dump: dict) -> dict:
    """Per process group: its status counters and its last few entries, small and bounded.

    Odd parts (an entry that is not a dict, a counter that is not a number) are left out.
    """
    raw_status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    status = {str(k)[:64]: v for k, v in raw_status.items()}
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    descs: dict[str, str] = {}
    recent: dict[str, list[dict]] = {}
    for e in entries:
        if not isinstance(e, dict):
            continue
        name, desc = _group_of(e)
        if name is None:
            continue
        descs.setdefault(name, desc)
        kept = recent.setdefault(name, [])
        kept.append(e)
        if len(kept) > RECENT_PER_GROUP:
            del kept[0]
    names = set(status) | set(recent)
    groups = []
    for name in sorted(names, key=_group_order)[:MAX_GROUPS]:
        counters = status.get(name) if isinstance(status.get(name), dict) else {}
        group_config = config.get(name) if isinstance(config.get(name), dict) else {}
        groups.append({
            "pg": name,
            "desc": descs.get(name) or _text(group_config.get("desc")),
            "size": _size(group_config.get("ranks")),
            **{field: _int(counters.get(key)) for field, key in STATUS_FIELDS},
            "recent": [_entry(e) for e in recent.get(name, [])],
        })
    return {"version": _text(dump.get("version"), 64), "groups": groups}


def _group_of(entry: dict) -> tuple[str | None, str]:
    """(pg name, pg description) of an entry: its ``process_group`` pair, else its pg_id."""
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg and isinstance(pg[0], str):
        return pg[0][:64], _text(pg[1] if len(pg) > 1 else "")
    pg_id = _int(entry.get("pg_id"))
    return (str(pg_id), "") if pg_id is not None else (None, "")


def _entry(e: dict) -> dict:
    p2p = e.get("is_p2p") is True
    created = _int(e.get("time_created_ns"))
    return {
        "seq": _int(e.get("p2p_seq_id" if p2p else "collective_seq_id")),
        "op": _op(e.get("profiling_name")),
        "state": _text(e.get("state"), 16),
        "created_at": created / 1e9 if created else None,
        "p2p": p2p,
    }


def _op(name) -> str:
    name = _text(name, 64)
    for prefix in BACKEND_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _size(ranks) -> int | None:
    """How many ranks a group has: pg_config's "ranks" is a list, or its text ("[0, 1]")."""
    if isinstance(ranks, list):
        return len(ranks) or None
    if isinstance(ranks, str):
        items = [p.strip() for p in ranks.strip().strip("[]").split(",") if p.strip()]
        return len(items) if items and all(p.lstrip("-").isdigit() for p in items) else None
    return None


def _group_order(name: str) -> tuple[int, int, str]:
    # The default group ("0") first, then the others by number, then any named ones.
    return (0, int(name), "") if name.isdigit() and len(name) < 10 else (1, 0, name)


def _int(value) -> int | None:
    """An integer, also from the JSON form's strings ("41", "-1")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -(2**62) < value < 2**62 else None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
        return int(value)
    return None


def _text(value, limit: int = 256) -> str:
    return value[:limit] if isinstance(value, str) else ""
