"""The per-job families of ``/metrics`` (``hangwatch_job_*``, ``hangwatch_rank_*``), written one job at a time.

They are most of a scrape: 4,000 ranks in jobs of 64 are ~74,000 series (18 a rank), 6.8 MB of text.
Each job's lines are written straight from its published result, with its labels escaped once (the
job id per job, a node's name per node), a rank's eleven ``hangwatch_rank_state`` lines from one
template per state, and 0/1 values as constants. ``JobSeries`` keeps each job's text while the
engine keeps publishing the same result object (results are immutable: the same object is the
same text), so a second scraper, or a scrape between passes, pays only for the jobs re-diagnosed.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Sequence

from monitor.diagnosis import VERDICTS
from monitor.diagnosis.activity import ACTIVITIES
from monitor.engine.published import JobResult
from monitor.web.exposition import escape, labels, number

# hangwatch_job_info's labels, from monitor/engine/job_names.py (pods are left out: a job has many).
JOB_INFO_LABELS = ("job_id", "slurm_job", "slurm_job_name", "k8s_namespace", "torchelastic_run_id", "display")
# Every word a rank's state can take: the activities plus "running" for a healthy job.
RANK_STATES = ("running", *ACTIVITIES)
# The labels every per-rank family (hangwatch_rank_*) carries, in this order: the node is on each,
# so any per-rank series can be joined or grouped by where the rank runs (and an alert name it).
RANK_LABELS = ("job_id", "rank", "node")
# Jobs of more ranks than this export per-rank series (hangwatch_rank_*) for their culprits only;
# hangwatch_job_ranks counts every job's ranks by state. 10,000 ranks x 18 series was 17 MB a scrape.
RANK_SERIES_MAX_RANKS = 1024

# The families, in the scrape's order: (name, help, type). Counters are named without "_total".
JOB_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("hangwatch_job_verdict", "1 for the job's current verdict, 0 for the others", "gauge"),
    ("hangwatch_job_info", "1 per job, with the names people know it by: Slurm job, Kubernetes namespace, "
     "torchelastic run, and display (what the page and alerts show)", "gauge"),
    ("hangwatch_job_last_progress_timestamp_seconds",
     "Unix time the job last made progress (when first seen if it never did)", "gauge"),
    ("hangwatch_job_culprit_ranks", "Number of culprit ranks", "gauge"),
    ("hangwatch_job_lost_rank_seconds",
     "Seconds the job spent under each alarm verdict, times its live ranks (rank-seconds lost)", "counter"),
    ("hangwatch_job_lost_gpu_seconds",
     "GPU-seconds the job lost under each alarm verdict (its live ranks with GPUs known)", "counter"),
    ("hangwatch_job_world_size", "World size the ranks report", "gauge"),
    ("hangwatch_job_pace_ratio", "The job's time per progress line now over its best settled pace of the last "
     "hour (1 at pace, 3 at a third of it); absent until the pace settled", "gauge"),
    ("hangwatch_job_goodput_ratio", "Progress the job made over what its best pace makes in the same time, since "
     "its pace settled (the last hour at most): 1 at pace, 0 stalled", "gauge"),
    ("hangwatch_job_progress_interval_seconds", "Seconds per progress line: pace=\"now\" (the last 10 s or more), "
     "pace=\"baseline\" (the job's best settled pace of the last hour)", "gauge"),
    ("hangwatch_job_ranks", "Ranks of the job in each state (the rank states of hangwatch_rank_state)", "gauge"),
    ("hangwatch_rank_cpu_seconds", "CPU time the rank process used", "counter"),
    ("hangwatch_rank_cpu_ratio", "Rank CPU use over the last interval, 1 = one core", "gauge"),
    ("hangwatch_rank_step", "Last training step the rank's log showed", "gauge"),
    ("hangwatch_rank_alive", "1 while the rank process is alive", "gauge"),
    ("hangwatch_rank_last_progress_timestamp_seconds",
     "Unix time the rank (or, without its own, its job) last progressed", "gauge"),
    ("hangwatch_rank_collective_wait_ratio",
     "Share of the rank's recent stack samples waiting in a collective (0-1)", "gauge"),
    ("hangwatch_rank_state", "1 for the rank's current state, 0 for the others", "gauge"),
    ("hangwatch_rank_culprit", "1 if the diagnosis names this rank as a culprit; node: where it runs", "gauge"),
)
# Where a rank's labels go in a state template; str.replace never looks into the labels it puts in.
_HOLE = "\x00"


def _state_template(current: str) -> str:
    """A rank's hangwatch_rank_state lines in ``current`` state, its labels (without the closing brace) left
    as _HOLE."""
    return "\n".join(f'hangwatch_rank_state{_HOLE},state="{word}"}} {"1.0" if word == current else "0.0"}'
                     for word in RANK_STATES)


# A state outside RANK_STATES (none today) is 0 in every state's series, as before.
_STATE_LINES = {word: _state_template(word) for word in RANK_STATES}
_NO_STATE_LINES = _state_template("")


def job_chunks(result: JobResult) -> tuple[str, ...]:
    """The job's lines of each family of JOB_FAMILIES, in that order, each family's joined ("" for none)."""
    view, d = result.view, result.diagnosis
    job = escape(view.job_id)
    job_l = f'{{job_id="{job}"}}'
    verdict = "\n".join(f'hangwatch_job_verdict{{job_id="{job}",verdict="{word}"}} {"1.0" if d.verdict == word else "0.0"}'
                        for word in VERDICTS)
    # One series per job: the names cost no cardinality beyond the job id's own.
    names = result.names
    info = f"hangwatch_job_info{labels(JOB_INFO_LABELS, (view.job_id, *(str(names.get(k, '')) for k in JOB_INFO_LABELS[1:])))} 1.0"
    last = result.last_progress_at if result.last_progress_at is not None else view.first_seen_at
    lost_rank = "\n".join(f'hangwatch_job_lost_rank_seconds_total{{job_id="{job}",verdict="{escape(word)}"}} '
                          f"{number(seconds)}" for word, seconds in sorted(result.lost_rank_seconds.items()))
    lost_gpu = "\n".join(f'hangwatch_job_lost_gpu_seconds_total{{job_id="{job}",verdict="{escape(word)}"}} '
                         f"{number(seconds)}" for word, seconds in sorted(result.lost_gpu_seconds.items()))
    pace_ratio = goodput = step_seconds = ""
    if view.pace is not None:
        pace_ratio = f"hangwatch_job_pace_ratio{job_l} {number(view.pace.ratio)}"
        step_seconds = (f'hangwatch_job_progress_interval_seconds{{job_id="{job}",pace="now"}} {number(view.pace.now_s)}\n'
                        f'hangwatch_job_progress_interval_seconds{{job_id="{job}",pace="baseline"}} '
                        f"{number(view.pace.baseline_s)}")
        if view.pace.goodput is not None:
            goodput = f"hangwatch_job_goodput_ratio{job_l} {number(view.pace.goodput)}"
    states = {rd.rank: rd.state for rd in d.ranks}
    by_state = Counter(states.values())
    ranks_by_state = "\n".join(f'hangwatch_job_ranks{{job_id="{job}",state="{word}"}} {number(by_state.get(word, 0))}'
                               for word in RANK_STATES)
    return (
        verdict, info, f"hangwatch_job_last_progress_timestamp_seconds{job_l} {number(last)}",
        f"hangwatch_job_culprit_ranks{job_l} {number(len(d.culprit_ranks))}", lost_rank, lost_gpu,
        f"hangwatch_job_world_size{job_l} {number(view.world_size)}", pace_ratio, goodput, step_seconds,
        ranks_by_state, *_rank_chunks(result, job, states),
    )


def _rank_chunks(result: JobResult, job: str, states: dict[int, str]) -> tuple[str, ...]:
    """The hangwatch_rank_* families' lines (cpu seconds to culprit, as in JOB_FAMILIES) of the job's ranks:
    every rank's in a job of RANK_SERIES_MAX_RANKS or fewer, its culprits' alone in a larger one."""
    view, d = result.view, result.diagnosis
    culprit_set = set(d.culprit_ranks)
    # A giant job's per-rank series would be most of the scrape (18 per rank): past
    # RANK_SERIES_MAX_RANKS its ranks are counted by state (hangwatch_job_ranks) and only its culprits get them.
    per_rank = view.ranks if len(view.ranks) <= RANK_SERIES_MAX_RANKS else [
        r for r in view.ranks if r.rank in culprit_set]
    job_last = view.job_progress_times[-1] if view.job_progress_times else None
    cpu_seconds = result.cpu_seconds
    cpu_total: list[str] = []
    cpu_ratio: list[str] = []
    step: list[str] = []
    alive: list[str] = []
    progress: list[str] = []
    wait: list[str] = []
    state: list[str] = []
    culprit: list[str] = []
    node_text: dict[str, str] = {}
    for r in per_rank:
        node = node_text.get(r.node)
        if node is None:
            node = node_text[r.node] = escape(r.node)
        prefix = f'{{job_id="{job}",rank="{r.rank}",node="{node}"'
        rank_l = prefix + "}"
        state.append(_STATE_LINES.get(states.get(r.rank, "unknown"), _NO_STATE_LINES).replace(_HOLE, prefix))
        culprit.append(f"hangwatch_rank_culprit{rank_l} {'1.0' if r.rank in culprit_set else '0.0'}")
        seconds = cpu_seconds.get(r.rank)
        if seconds is not None:
            cpu_total.append(f"hangwatch_rank_cpu_seconds_total{rank_l} {number(seconds)}")
        if r.cpu_percent is not None:
            cpu_ratio.append(f"hangwatch_rank_cpu_ratio{rank_l} {number(r.cpu_percent / 100.0)}")
        if r.step is not None:
            step.append(f"hangwatch_rank_step{rank_l} {number(r.step)}")
        alive.append(f"hangwatch_rank_alive{rank_l} {'1.0' if r.alive else '0.0'}")
        rank_last = r.progress_times[-1] if r.progress_times else job_last
        if rank_last is not None:
            progress.append(f"hangwatch_rank_last_progress_timestamp_seconds{rank_l} {number(rank_last)}")
        if r.collective_wait_share is not None:
            wait.append(f"hangwatch_rank_collective_wait_ratio{rank_l} {number(r.collective_wait_share)}")
    return tuple("\n".join(lines) for lines in (cpu_total, cpu_ratio, step, alive, progress, wait, state, culprit))


class JobSeries:
    """Each job's ``job_chunks``, kept while the engine publishes the same result object for it.

    The result is held by a weak reference: a replaced result (its view of every rank) is freed when the
    engine lets it go, not at the next scrape. Safe for scrapes on several worker threads at once: each
    reads the map it finds and puts a new one in place with one assignment (a race costs a job written
    twice, never a wrong text)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[weakref.ref[JobResult], tuple[str, ...]]] = {}

    def chunks(self, results: Sequence[JobResult]) -> list[tuple[str, ...]]:
        """Each result's chunks, in order; jobs not among ``results`` are let go."""
        kept = self._kept
        fresh: dict[str, tuple[weakref.ref[JobResult], tuple[str, ...]]] = {}
        out = []
        for result in results:
            job_id = result.view.job_id
            hit = kept.get(job_id)
            if hit is not None and hit[0]() is result:
                fresh[job_id] = hit
                chunks = hit[1]
            else:
                chunks = job_chunks(result)
                fresh[job_id] = (weakref.ref(result), chunks)
            out.append(chunks)
        self._kept = fresh
        return out


__all__ = ["JOB_FAMILIES", "JOB_INFO_LABELS", "RANK_LABELS", "RANK_SERIES_MAX_RANKS", "RANK_STATES", "JobSeries",
           "job_chunks"]
