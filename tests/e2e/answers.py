"""Reading /diagnose answers in e2e tests: the words a person reads, and a compact dump for failures."""

from __future__ import annotations

import json

RANK_FIELDS = ("rank", "node", "state", "cpu_percent", "step", "top_frame", "compute_dtype", "collective_wait_share")


def text_of(job: dict) -> str:
    return "\n".join([job.get("summary", ""), *job.get("evidence", []), *job.get("hints", [])])


def compact(job: dict | None) -> str:
    if job is None:
        return "(no answer)"
    keep = {k: job.get(k) for k in ("verdict", "culprit_ranks", "summary", "evidence", "hints")}
    keep["ranks"] = [{k: r.get(k) for k in RANK_FIELDS} for r in job.get("ranks", [])]
    if job.get("launchers"):
        keep["launchers"] = job.get("launchers")
    return json.dumps(keep, indent=1)
