"""The ranks' own clock (issue 32), table-style: what the ranks do outranks what the job prints.

Each row is a job whose log says one thing (a side thread's counter still rising, a line every 100
steps, nothing at all) while its ranks' CPU, bytes and stacks say another.
"""

from __future__ import annotations

import pytest

from monitor.diagnosis import diagnose
from monitor.diagnosis.activity import STUCK_IO_S
from monitor.diagnosis.held import HELD_MIN_S, allowance_s, held_stall
from monitor.diagnosis.model import BlockedIo
from tests.diagnosis.builders import (
    NOW,
    collective,
    computing,
    evaluating,
    job,
    py,
    rank,
    saving_checkpoint,
    sleeping,
    steps,
)

DCP = "/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/"


def dcp_loading() -> tuple:
    """Every rank reading its shard with torch.distributed.checkpoint (torchtitan's resume)."""
    return (py("read_data", DCP + "filesystem.py", 640), py("load", DCP + "state_dict_loader.py", 180),
            py("resume", "/work/job/train.py", 40), py("main", "/work/job/train.py", 110))


def waiting_for_data() -> tuple:
    """The main thread in a DataLoader's queue get: its workers died or hang."""
    queues = "/usr/lib/python3.11/multiprocessing/queues.py"
    loader = "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py"
    return (py("get", queues, 113), py("_try_get_data", loader, 1130), py("__next__", loader, 700),
            py("main", "/work/job/train.py", 95))

# A side thread prints a counter twice a second, to this very moment.
BEATING = steps(NOW - 0.3, 0.5, 30)
# One line every 100 steps of 0.16 s: the last one 10 s ago.
SPARSE = steps(NOW - 10, 16.0, 8)
SPARSE_STEP_S = 0.16
AR = "all_reduce@train.py:60"


def held(r: int, frames, since: float, *, stacks: int = 2, cpu: float = 0.0, **extra):
    """A rank idle since ``since`` (after it was seen at work), its stacks since then at ``frames``."""
    return rank(r, cpu=cpu, frames=frames, idle_since=since, held_stacks=stacks, held_since=since, stack_at=NOW - 1,
                **extra)


ALARMS = [
    pytest.param(
        job(held(0, collective("all_reduce", 60), NOW - 8, progress=BEATING, progress_pattern=(
                "learned (counter, 4 lines agree): [hb] rank # beat # uptime #.#s")),
            held(1, sleeping(), NOW - 8, progress=BEATING)),
        "deadlock", (1,), ("rank 0 waits in all_reduce", "rank 1 never reached it"),
        ("not counted", "[hb] rank # beat #"),
        id="a side thread's counter keeps rising: the deadlock is named all the same"),
    pytest.param(
        job(held(0, collective("all_reduce", 60), NOW - 6, progress=SPARSE, step_time_s=SPARSE_STEP_S),
            held(1, sleeping(), NOW - 6)),
        "deadlock", (1,), ("rank 1 never reached it",), ("held in all_reduce@train.py:60 for 6s",),
        id="a line every 100 steps (16 s apart): the stacks name the deadlock in seconds"),
    pytest.param(
        job(held(0, collective("all_reduce", 60), NOW - 8, progress=BEATING),
            rank(1, cpu=100.0, frames=computing(), progress=BEATING)),
        "straggler", (1,), ("rank 1 still busy",), ("not counted",),
        id="a side thread's counter and a rank that computes on: a straggler"),
    pytest.param(
        job(held(0, saving_checkpoint(), NOW - STUCK_IO_S - 2,
                 blocked_io=BlockedIo("openat", "/mnt/ckpt/step-4000.pt"), progress=SPARSE),
            held(1, collective("barrier", 145), NOW - STUCK_IO_S - 2, progress=SPARSE)),
        "deadlock", (0,), ("rank 0 is stuck in I/O (openat /mnt/ckpt/step-4000.pt)",),
        ("blocked in openat on /mnt/ckpt/step-4000.pt", "stuck I/O"),
        id="a save whose open never returns: stuck I/O, the file named"),
    pytest.param(
        job(held(0, saving_checkpoint(), NOW - STUCK_IO_S - 2, progress=steps(NOW - STUCK_IO_S - 3, 0.1)),
            held(1, collective("barrier", 145), NOW - STUCK_IO_S - 2)),
        "deadlock", (0,), ("rank 0 is stuck in I/O",), ("stuck I/O",),
        id="a save held at idle CPU in a job that logs every step: its phase grace is void"),
    pytest.param(
        job(rank(0, cpu=0.0, state="D", state_since=NOW - STUCK_IO_S - 2, idle_since=NOW - STUCK_IO_S - 2,
                 blocked_io=BlockedIo("openat"), progress=SPARSE),
            held(1, collective("barrier", 145), NOW - STUCK_IO_S - 2, progress=SPARSE)),
        "deadlock", (0,), ("rank 0 is stuck in I/O (openat ?)",), ("blocked in openat",),
        id="an open on a hard NFS mount that hangs: the disk wait (D), no stack to be had, still stuck I/O"),
    pytest.param(
        job(*(held(r, dcp_loading(), NOW - STUCK_IO_S - 2, blocked_io=BlockedIo("read", f"/mnt/ckpt/__{r}_0.distcp"),
                   progress=BEATING) for r in range(3))),
        "stalled", (0, 1, 2), ("rank 0 is stuck in I/O (read /mnt/ckpt/__0_0.distcp)",
                               "no rank is in a collective or at work"),
        ("blocked in read on /mnt/ckpt/__2_0.distcp",),
        id="every rank's checkpoint load hangs (no collective at all): stuck I/O on every rank"),
    pytest.param(
        job(*(held(r, waiting_for_data(), NOW - 8, progress=BEATING) for r in range(2))),
        "stalled", (), ("every rank sits idle outside any collective", "runs on no rank"), ("not counted",),
        id="every rank waits on a data loader that never delivers, a heartbeat still beating"),
]


@pytest.mark.parametrize("view, verdict, culprits, in_summary, in_evidence", ALARMS)
def test_the_ranks_own_state_names_the_hang(view, verdict, culprits, in_summary, in_evidence):
    got = diagnose(view)
    assert (got.verdict, got.culprit_ranks) == (verdict, culprits), got
    for text in in_summary:
        assert text in got.summary, got.summary
    evidence = "\n".join(got.evidence)
    for text in in_evidence:
        assert text in evidence, evidence


HEALTHY = [
    pytest.param(job(held(0, collective("all_reduce", 60), NOW - HELD_MIN_S + 1, progress=BEATING),
                     held(1, sleeping(), NOW - HELD_MIN_S + 1, progress=BEATING)),
                 id="held a moment (under the floor): no verdict yet"),
    pytest.param(job(held(0, collective("all_reduce", 60), NOW - 10, progress=BEATING),
                     rank(1, cpu=100.0, frames=computing(), progress=BEATING),
                     pauses_by_site=((AR, 5.0),)),
                 id="a rank that waits 5 s there every step may wait 15 s"),
    pytest.param(job(held(0, collective("all_reduce", 60), NOW - 20, progress=steps(NOW - 3, 8.0),
                          step_time_s=8.0),
                     rank(1, cpu=100.0, frames=computing(), progress=steps(NOW - 3, 8.0))),
                 id="8-s steps: a peer waits 20 s in one without alarm"),
    pytest.param(job(held(0, collective("all_reduce", 60), NOW - 8, progress=BEATING, bytes_per_s=500_000.0),
                     held(1, collective("all_reduce", 60), NOW - 8, progress=BEATING)),
                 id="bytes still moving: a slow link sets the pace"),
    pytest.param(job(held(0, collective("barrier", 145), NOW - 20, progress=SPARSE),
                     rank(1, cpu=100.0, frames=evaluating(), progress=SPARSE)),
                 id="rank 1 evaluating 20 s while rank 0 waits at a barrier"),
    pytest.param(job(held(0, saving_checkpoint(), NOW - 12, progress=SPARSE),
                     held(1, collective("barrier", 145), NOW - 12, progress=SPARSE)),
                 id="a save at idle CPU for 12 s: still within the stuck-I/O bound"),
    pytest.param(job(rank(0, cpu=10.0, frames=saving_checkpoint(), bytes_per_s=50e6, progress=SPARSE),
                     held(1, collective("barrier", 145), NOW - 60, progress=SPARSE)),
                 id="a checkpoint that writes keeps its grace however long"),
    pytest.param(job(*(held(r, dcp_loading(), NOW - 12, progress=BEATING) for r in range(2))),
                 id="every rank loading its shard for 12 s: a load keeps its grace until the stuck-I/O bound"),
    pytest.param(job(*(held(r, waiting_for_data(), NOW - 2, progress=BEATING) for r in range(2)),
                     pauses_by_site=(("", 0.5),)),
                 id="every rank idle a moment between steps"),
    pytest.param(job(rank(0, cpu=0.0, frames=saving_checkpoint(), stack_at=NOW - 11, state="D",
                          state_since=NOW - 10, idle_since=NOW - 10, progress=steps(NOW - 12, 16.0, 8)),
                     held(1, collective("barrier", 145), NOW - 10, progress=steps(NOW - 12, 16.0, 8))),
                 id="a save in the disk wait for 10 s (a flush): writing, within its grace"),
    pytest.param(job(rank(0, frames=collective("all_reduce", 60), idle_since=NOW - 30, progress=BEATING),
                     rank(1, frames=sleeping(), idle_since=NOW - 30, progress=BEATING)),
                 id="idle without held stacks (never seen at work, or stacks that moved): the log's word stands"),
]


@pytest.mark.parametrize("view", HEALTHY)
def test_no_alarm_while_the_ranks_may_be_training(view):
    got = diagnose(view)
    assert got.verdict == "healthy", got
    assert got.progress_discounted_after is None


def test_discounted_progress_is_marked_for_the_published_verdict():
    view = ALARMS[0].values[0]
    got = diagnose(view)
    assert got.progress_discounted_after == NOW - 8


@pytest.mark.parametrize(
    "pauses, step_s, site, expect",
    [
        ((), None, AR, HELD_MIN_S),
        (((AR, 5.0),), None, AR, 15.0),
        (((AR, 5.0),), None, "barrier@train.py:145", HELD_MIN_S),  # a wait elsewhere says nothing here
        ((("", 2.0), (AR, 1.0)), None, AR, 6.0),  # a pause no stack saw counts everywhere
        ((), 0.16, AR, HELD_MIN_S),
        ((), 3.0, AR, 15.0),
    ],
)
def test_the_allowance_is_the_jobs_own_wait_profile(pauses, step_s, site, expect):
    view = job(rank(0), pauses_by_site=pauses)
    assert allowance_s(view, site, step_s) == pytest.approx(expect)


def test_the_stall_starts_when_the_first_rank_went_idle():
    view = job(held(0, collective("all_reduce", 60), NOW - 9, progress=BEATING),
               held(1, collective("all_reduce", 60), NOW - 7, progress=BEATING))
    found = held_stall(view)
    assert found is not None
    assert (found.since, found.ranks, found.site) == (NOW - 9, (0, 1), AR)
