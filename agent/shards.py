"""Several monitors, each owning a share of the jobs: which job's ranks go where.

Past what one monitor holds (docs/scaling.md), monitors are sharded by job id. The agent
does the routing, so no broker or proxy sits in the reporting path: it is given every
monitor (``--monitor URL`` repeated) and sends each job's ranks and launchers to the one
monitor that owns the job, by rendezvous hashing of the job id over the monitors' URLs.
Every agent computes the same owner for the same id, so a job spread over many nodes lands
whole on one monitor; adding a monitor moves only the jobs the new one wins.

Node-level facts (host, agent health, collectors, leftover processes) go with the ranks to
each monitor that owns a job on the node, and always to the monitor that owns the node's
name, so every node is listed (and alerted on when silent) by exactly one monitor at least.
Monitors with nothing of the node's hear nothing from it: each post costs a monitor CPU.

One limit: a job is one id only if every node spells it the same. Nodes that name the master
differently (a host name here, an address there) are joined by one monitor (README,
contract 3), not across monitors; set ``TORCHELASTIC_RUN_ID`` (or one MASTER_ADDR spelling)
for jobs sharded monitors watch.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence


def owner(job_id: str, monitors: Sequence[str]) -> str:
    """The monitor that owns ``job_id``: the highest hash of (monitor, job id) wins."""
    return max(monitors, key=lambda m: (zlib.crc32(f"{m}\0{job_id}".encode()), m))


def split(report: dict, monitors: Sequence[str]) -> dict[str, dict]:
    """One report per monitor concerned: its jobs' ranks and launchers, and the node-level facts."""
    if len(monitors) == 1:
        return {monitors[0]: report}
    ranks: dict[str, list[dict]] = {m: [] for m in monitors}
    job_of_pid = {}
    for rank in report.get("ranks", []):
        target = owner(rank["job_id"], monitors)
        ranks[target].append(rank)
        job_of_pid[rank.get("pid")] = target
    launchers: dict[str, list[dict]] = {m: [] for m in monitors}
    for launcher in report.get("launchers", []):
        if launcher.get("job_id"):
            targets = [owner(launcher["job_id"], monitors)]
        else:
            # A launcher that names no job goes where its workers went; before it has
            # workers nobody knows its job, so every monitor sees it.
            targets = sorted({job_of_pid[p] for p in launcher.get("worker_pids", []) if p in job_of_pid}) or monitors
        for target in targets:
            launchers[target].append(launcher)
    node_owner = owner(report.get("node", ""), monitors)
    return {m: dict(report, ranks=ranks[m], launchers=launchers[m]) for m in monitors
            if ranks[m] or launchers[m] or m == node_owner}
