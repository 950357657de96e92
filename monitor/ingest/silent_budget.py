"""What the monitor keeps of jobs and nodes no agent mentions any more, bounded in bytes.

A job is kept for the job retention after its agents last mention it, and a node for a day
(monitor/ingest/retention.py): so a job whose agent stopped reads ``unknown`` naming the silent node, and
the node's alert holds. Junk sent once under ever new node names is silent a second later, and was
kept as long: after a 20-s flood of padded reports (benchmarks/abuse.py, case padded: up to 2,000
junk jobs, each rank keeping 10 error lines of 2 KB) the monitor held about 90 KiB a junk job,
170 MiB in all, for the whole retention (and its RSS more: monitor/web/heap_trim.py).

So what has been silent for ``silent_s`` (the job_room_silent_s setting) takes at most
``max_bytes`` all together, as estimated by ``job_bytes`` and ``node_bytes``; past that, the
densest is forgotten first (the most bytes per rank, or per node), so padded junk goes before a
real job's picture, a few KiB a rank. What reports now is never forgotten; nor is anything while
no agent at all reports (then the monitor is the one cut off, and keeps its picture for when the
agents are back). A job forgotten here comes back as new if its agents speak again, as one
displaced at max_jobs does (monitor/ingest/retention.make_room_for_jobs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
import pydantic

from monitor.ingest.job_track import JobTrack
from monitor.ingest.retention import forget_job
from monitor.ingest.state import MonitorState
from monitor.ingest.tracks import NodeTrack

log = logging.getLogger("hangwatch.monitor")

# The default of the max_silent_bytes setting: the whole picture of a monitor's 10,000 ranks at about
# 25 KiB each, so a partition that silences most of a real cluster forgets nothing of it.
MAX_SILENT_BYTES = 256 * 1024 * 1024
# What the records around a kept report take beside the report itself (measured on CPython 3.11
# with tracemalloc: a rank's track with its histories, view and diagnosis 10-16 KiB; a job's own
# records; a node's).
RANK_RECORD_BYTES = 12 * 1024
JOB_RECORD_BYTES = 8 * 1024
NODE_RECORD_BYTES = 2 * 1024


def _as_plain(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):  # a report taken in without fastwire (tests)
        return value.model_dump(mode="json")
    raise NotImplementedError(type(value).__name__)


def report_bytes(value: Any) -> int:
    """About the memory a kept report (or a part of one) holds: its length as JSON, which counts
    every string it carries (error lines, command lines, stacks, environments) as what it takes."""
    return len(msgspec.json.encode(value, enc_hook=_as_plain))


def job_bytes(job: JobTrack) -> int:
    tracks: Iterable[Any] = (*job.ranks.values(), *job.launchers.values())
    return JOB_RECORD_BYTES + sum(RANK_RECORD_BYTES + report_bytes(t.latest) for t in tracks)


def node_bytes(node: NodeTrack) -> int:
    ras = node.nccl_ras.answer if node.nccl_ras is not None else None
    return NODE_RECORD_BYTES + report_bytes((node.agent, node.host, node.collectors, node.orphans, ras))


class _Silent(NamedTuple):
    kind: str  # "job" or "node"
    key: str
    silent_since: float
    size: int
    per_unit: float  # bytes per rank (a job) or per node: the densest is forgotten first


@dataclass
class SilentBudget:
    """Called at each diagnosis pass: ``enforce``."""

    max_bytes: int
    # Key -> (its last report time, its size), of the jobs and the nodes silent at the last pass: a
    # silent one does not change, so each is measured once.
    _job_sizes: dict[str, tuple[float, int]] = field(default_factory=dict)
    _node_sizes: dict[str, tuple[float, int]] = field(default_factory=dict)

    def enforce(self, state: MonitorState, now: float, silent_s: float) -> list[str]:
        """Forget silent jobs and nodes, the densest first, until the silent ones fit ``max_bytes``.
        Returns the ids of the jobs forgotten."""
        nodes, jobs = state.nodes, state.jobs
        job_sizes, _ = _silent_sizes(jobs, self._job_sizes, job_bytes, now, silent_s)
        node_sizes, anyone_reports = _silent_sizes(nodes, self._node_sizes, node_bytes, now, silent_s)
        self._job_sizes, self._node_sizes = job_sizes, node_sizes  # never more than the state holds
        total = sum(size for _, size in job_sizes.values()) + sum(size for _, size in node_sizes.values())
        if total <= self.max_bytes or not anyone_reports:
            return []
        silent = [_Silent("job", key, at, size, size / max(1, len(jobs[key].ranks) + len(jobs[key].launchers)))
                  for key, (at, size) in job_sizes.items()]
        silent += [_Silent("node", key, at, size, size) for key, (at, size) in node_sizes.items()]
        forgotten: list[str] = []
        forgotten_nodes = 0
        pending = sorted(silent, key=lambda s: (-s.per_unit, s.silent_since))
        # Twice: a node whose jobs were kept at its turn may be free once a lighter job of it is gone.
        for _ in range(2):
            held = []
            for entry in pending:
                if total <= self.max_bytes:
                    break
                if entry.kind == "job":
                    forget_job(jobs, state.aliases, entry.key)
                    forgotten.append(entry.key)
                elif _holds_kept_job(nodes[entry.key], jobs):
                    held.append(entry)  # its jobs' views read its last report: it goes after them
                    continue
                else:
                    del nodes[entry.key]
                    forgotten_nodes += 1
                total -= entry.size
            pending = held
        log.info("silent jobs and nodes past max_silent_bytes (%.0f MiB): forgot %d jobs (%s) and %d nodes, densest "
                 "first", self.max_bytes / 2**20, len(forgotten), ", ".join(forgotten[:3]) + " ..." * (len(forgotten) > 3),
                 forgotten_nodes)
        return forgotten


def _silent_sizes(tracks: Mapping[str, Any], known: Mapping[str, tuple[float, int]], measure: Callable[[Any], int],
                  now: float, silent_s: float) -> tuple[dict[str, tuple[float, int]], bool]:
    """(last report time, size) of each of ``tracks`` (jobs or nodes) silent for ``silent_s``, measured
    again only if it reported since ``known`` was taken; and whether any of them is not silent."""
    sizes: dict[str, tuple[float, int]] = {}
    anyone_reports = False
    for key, track in tracks.items():
        at = track.last_report_at
        if now - at <= silent_s:
            anyone_reports = True
            continue
        size = known.get(key)
        sizes[key] = size if size is not None and size[0] == at else (at, measure(track))
    return sizes, anyone_reports


def _holds_kept_job(node: NodeTrack, jobs: dict[str, JobTrack]) -> bool:
    return any(job_id in jobs for job_id, _ in node.rank_keys) or any(job_id in jobs for job_id, _ in node.launcher_keys)
