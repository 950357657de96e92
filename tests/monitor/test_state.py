"""MonitorState and views: reports in, JobView out, times on the monitor's clock."""

from __future__ import annotations

from typing import Any

import pytest
from monitor_reports import ALL_REDUCE_FRAMES, frame, launcher, progress, rank, report, stack

from monitor.diagnosis import ExitView, Frame, Stack
from monitor.ingest.retention import SILENT_NODE_KEPT_S
from monitor.ingest.state import MonitorState
from monitor.ingest.tracks import PROGRESS_POINTS_KEPT
from monitor.engine.views import job_view
from monitor.ingest.wire import Report
from monitor.ingest.job_track import JobTrack
from monitor.ingest.retention import make_room_for_jobs, make_room_for_ranks

T0 = 1_700_000_000.0


def apply(state: MonitorState, body: dict[str, Any], received_at: float, **kw: Any) -> set[str]:
    return state.apply(Report.model_validate(body), received_at, **kw)


def view(state: MonitorState, job: str = "job-a", now: float = T0 + 100):
    return job_view(state.jobs[job], state.nodes, now)


def test_times_are_shifted_onto_the_monitor_clock() -> None:
    state = MonitorState()
    skew = -500.0  # the agent's clock runs 500 s behind the monitor's
    agent_now = T0 + skew
    r = rank(
        progress=progress(3, 30, [(agent_now - 2, 28), (agent_now - 1, 29), (agent_now, 30)]),
        stack=stack(agent_now - 0.5),
        alive=False,
        exit={"at": agent_now - 0.2, "code": 1, "source": "proc"},
        log_phase={"phase": "evaluation", "seen_at": agent_now - 0.3, "line": "eval step 30 | val loss 2.3"},
    )
    apply(state, report(ranks=[r], sent_at=agent_now), received_at=T0)
    rv = view(state).ranks[0]
    assert rv.log_phase is not None and rv.log_phase.seen_at == pytest.approx(T0 - 0.3)
    assert (rv.log_phase.phase, rv.log_phase.line) == ("evaluation", "eval step 30 | val loss 2.3")
    assert rv.progress_times == pytest.approx((T0 - 2, T0 - 1, T0))
    assert rv.stack is not None and rv.stack.taken_at == pytest.approx(T0 - 0.5)
    assert rv.exit is not None and rv.exit.at == pytest.approx(T0 - 0.2)
    assert rv.first_seen_at == rv.observed_at == T0


def test_state_since_changes_only_when_the_letter_changes() -> None:
    state = MonitorState()
    for i, letter in enumerate(["R", "R", "S", "S", "S"]):
        apply(state, report(ranks=[rank(state=letter)], sent_at=T0 + i), received_at=T0 + i)
    rv = view(state).ranks[0]
    assert rv.proc_state == "S"
    assert rv.state_since == T0 + 2
    assert rv.observed_at == T0 + 4
    assert rv.first_seen_at == T0


def test_idle_since_starts_at_the_report_before_cpu_dropped_and_resets_on_work() -> None:
    state = MonitorState()
    cpus = [100.0, 99.0, 2.0, 0.5, None, 1.0]
    for i, cpu in enumerate(cpus):
        apply(state, report(ranks=[rank(cpu_percent=cpu)], sent_at=T0 + i), received_at=T0 + i)
    # CPU covers the interval since the previous sample (at T0+1), and None keeps the run going.
    assert view(state).ranks[0].idle_since == T0 + 1
    apply(state, report(ranks=[rank(cpu_percent=50.0)], sent_at=T0 + 6), received_at=T0 + 6)
    assert view(state).ranks[0].idle_since is None


def test_rank_progress_is_deduplicated_and_capped() -> None:
    state = MonitorState()
    history: list[tuple[float, int]] = []
    for i in range(100):
        history.append((T0 + i, i))
        # The agent resends its recent window each time: overlapping entries must count once.
        p = progress(i + 1, i, history[-5:])
        apply(state, report(ranks=[rank(progress=p)], sent_at=T0 + i), received_at=T0 + i + 0.01 * (i % 3))
    rv = view(state).ranks[0]
    assert len(rv.progress_times) == 64
    assert rv.progress_times[-1] == pytest.approx(T0 + 99, abs=0.05)
    assert list(rv.progress_times) == sorted(rv.progress_times)
    assert rv.step == 99


def test_progress_events_without_recent_use_step_at_or_receive_time() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank(progress=progress(1, 1))], sent_at=T0), received_at=T0)
    assert view(state).ranks[0].progress_times == ()  # first sight, no time to go by
    apply(state, report(ranks=[rank(progress=progress(2, 2, step_at=T0 + 4.5))], sent_at=T0 + 5), received_at=T0 + 5)
    apply(state, report(ranks=[rank(progress=progress(3, 3))], sent_at=T0 + 6), received_at=T0 + 6)
    apply(state, report(ranks=[rank(progress=progress(3, 3))], sent_at=T0 + 7), received_at=T0 + 7)
    assert view(state).ranks[0].progress_times == (T0 + 4.5, T0 + 6)


def test_job_scope_progress_counts_each_line_once_across_ranks() -> None:
    state = MonitorState()
    for i in range(3):
        recent = [(T0 + j, j) for j in range(i + 1)]
        ranks = [rank(rank=r, progress=progress(i + 1, i, recent, scope="job")) for r in range(4)]
        apply(state, report(ranks=ranks, sent_at=T0 + i), received_at=T0 + i)
    jv = view(state)
    assert jv.job_progress_times == (T0, T0 + 1, T0 + 2)
    assert jv.job_step == 2
    assert all(r.progress_times == () for r in jv.ranks)


def test_the_last_stack_is_kept_when_a_later_report_has_none() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank(stack=stack(T0, active=False))], sent_at=T0), received_at=T0)
    apply(state, report(ranks=[rank(stack=None, stack_error="py-spy timed out")], sent_at=T0 + 1), received_at=T0 + 1)
    rv = view(state).ranks[0]
    assert rv.stack == Stack(
        taken_at=T0,
        frames=tuple(Frame(f["name"], f["file"], f["line"], f["native"]) for f in ALL_REDUCE_FRAMES),
        native=False,
        active=False,
    )
    assert rv.stack.frames[0].where() == "all_reduce (torch/distributed/distributed_c10d.py:2501)"
    assert rv.stack_error == "py-spy timed out"


def test_exit_carries_the_last_logged_error() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank(log_errors=["ValueError: a"])], sent_at=T0), received_at=T0)
    r = rank(alive=False, exit={"at": T0 + 1, "code": 1, "source": "proc"},
             log_errors=["ValueError: a", "RuntimeError: Connection closed by peer"])
    apply(state, report(ranks=[r], sent_at=T0 + 2), received_at=T0 + 2)
    rv = view(state).ranks[0]
    assert not rv.alive
    assert rv.exit == ExitView(at=T0 + 1, code=1, signal=None, error="RuntimeError: Connection closed by peer")
    assert rv.exit.failed
    assert rv.log_errors == ("ValueError: a", "RuntimeError: Connection closed by peer")


def test_a_rank_the_agent_stops_listing_is_treated_as_vanished() -> None:
    state = MonitorState()
    both = [rank(rank=0), rank(rank=1)]
    apply(state, report(ranks=both, sent_at=T0), received_at=T0)
    touched = apply(state, report(ranks=[rank(rank=0)], sent_at=T0 + 1), received_at=T0 + 1)
    assert touched == {"job-a"}
    r0, r1 = view(state).ranks
    assert r0.alive and r0.exit is None
    assert not r1.alive
    assert r1.exit == ExitView(at=T0)
    # Another node's report says nothing about this node's ranks.
    apply(state, report(node="node-b", ranks=[], sent_at=T0 + 2), received_at=T0 + 2)
    assert view(state).ranks[0].alive


def test_ranks_from_several_nodes_merge_into_one_job() -> None:
    state = MonitorState()
    apply(state, report(node="node-a", ranks=[rank(rank=0, world_size=4), rank(rank=1, world_size=4)]), T0)
    apply(state, report(node="node-b", ranks=[rank(rank=2, world_size=4), rank(rank=3, world_size=4)],
                        host={"cpu_flags": ["amx_bf16"], "cpu_model": "Other CPU"}), T0 + 0.5)
    jv = view(state)
    assert [(r.rank, r.node) for r in jv.ranks] == [(0, "node-a"), (1, "node-a"), (2, "node-b"), (3, "node-b")]
    assert jv.world_size == 4
    assert jv.first_seen_at == T0
    assert jv.hosts["node-b"].cpu_flags == frozenset({"amx_bf16"})
    assert jv.hosts["node-a"].cpu_model == "Test CPU"


def test_a_new_pid_starts_the_process_facts_over() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank(pid=10, stack=stack(T0), state="S")], sent_at=T0), received_at=T0)
    apply(state, report(ranks=[rank(pid=11, state="S")], sent_at=T0 + 5), received_at=T0 + 5)
    rv = view(state).ranks[0]
    assert rv.pid == 11
    assert rv.stack is None
    assert rv.state_since == T0 + 5
    assert rv.first_seen_at == T0


def test_stacks_unavailable_only_when_every_node_says_so() -> None:
    state = MonitorState()
    no_spy = {"py_spy": "ptrace not permitted (ptrace_scope=1)"}
    apply(state, report(node="node-a", ranks=[rank(rank=0)], agent=no_spy), T0)
    apply(state, report(node="node-b", ranks=[rank(rank=1)]), T0)
    assert view(state).stacks_unavailable_reason is None
    apply(state, report(node="node-b", ranks=[rank(rank=1)], agent=no_spy), T0 + 1)
    assert view(state).stacks_unavailable_reason == "ptrace not permitted (ptrace_scope=1)"


def test_wait_sites_become_known_once_the_job_progresses_past_them() -> None:
    state = MonitorState()

    def wait_site(s: Stack, cpu_percent: float | None) -> str | None:
        return f"{s.frames[0].name}@{s.frames[2].where()}" if s.frames else None

    r = rank(stack=stack(T0), progress=progress(1, 1, [(T0 - 1, 1)]))
    apply(state, report(ranks=[r], sent_at=T0), received_at=T0, wait_site=wait_site)
    assert view(state).known_wait_sites == frozenset()  # no progress since the stack yet
    r = rank(progress=progress(2, 2, [(T0 - 1, 1), (T0 + 1, 2)]))
    apply(state, report(ranks=[r], sent_at=T0 + 1), received_at=T0 + 1, wait_site=wait_site)
    assert view(state).known_wait_sites == frozenset({"all_reduce@train_step (train.py:50)"})


def test_prune_forgets_ended_and_silent_jobs() -> None:
    state = MonitorState()
    done = rank(job_id="done", alive=False, exit={"at": T0, "code": 0})
    apply(state, report(ranks=[done], sent_at=T0), T0)
    apply(state, report(node="node-b", ranks=[rank(job_id="live")]), T0)
    assert state.prune(T0 + 100, retention_s=300) == []
    apply(state, report(node="node-b", ranks=[rank(job_id="live")]), T0 + 400)
    assert state.prune(T0 + 400, retention_s=300) == ["done"]
    # A silent node outlives its jobs (its agent-silent alert holds), for a day.
    assert set(state.nodes) == {"node-a", "node-b"}
    assert state.prune(T0 + 800, retention_s=300) == ["live"]
    # An agent still listing the dead ranks does not bring the job back; a live rank does.
    apply(state, report(ranks=[done], sent_at=T0 + 801), T0 + 801)
    assert "done" not in state.jobs
    apply(state, report(ranks=[rank(job_id="done")], sent_at=T0 + 802), T0 + 802)
    assert "done" in state.jobs
    state.prune(T0 + 802 + SILENT_NODE_KEPT_S + 1, retention_s=300)
    assert state.nodes == {}


def test_log_errors_merge_windows_and_increments() -> None:
    state = MonitorState()
    for errors in (["a", "b"], ["a", "b"], ["b", "c"], ["d"], []):
        apply(state, report(ranks=[rank(log_errors=errors)]), T0)
    assert view(state).ranks[0].log_errors == ("a", "b", "c", "d")


def test_frame_is_rendered_from_stack_thread_zero() -> None:
    state = MonitorState()
    s = stack(T0, frames=[frame("pthread_cond_wait", native=True)], active=True)
    apply(state, report(ranks=[rank(stack=s)], sent_at=T0), received_at=T0)
    st = view(state).ranks[0].stack
    assert st is not None and st.active is True and st.frames[0].where() == "pthread_cond_wait"


def test_rank_progress_points_are_shifted_deduplicated_and_capped() -> None:
    state = MonitorState()
    skew = -300.0  # the agent's clock runs 5 min behind the monitor's
    history: list[tuple[float, int]] = []
    for i in range(150):
        history.append((T0 + skew + i, 10 * i))
        # The agent resends its recent window, and the shift jitters with latency:
        # each point must still be kept once.
        p = progress(i + 1, 10 * i, history[-5:])
        apply(state, report(ranks=[rank(progress=p)], sent_at=T0 + skew + i), received_at=T0 + i + 0.01 * (i % 3))
    points = list(state.jobs["job-a"].ranks[0].progress_points)
    assert len(points) == PROGRESS_POINTS_KEPT
    assert [step for _, step in points] == [10 * i for i in range(150 - PROGRESS_POINTS_KEPT, 150)]
    assert points[-1][0] == pytest.approx(T0 + 149, abs=0.05)
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    assert not state.jobs["job-a"].progress_points


def test_job_scope_points_are_kept_once_per_log_and_ranks_keep_none() -> None:
    state = MonitorState()
    history: list[tuple[float, int]] = []
    for i in range(5):
        history.append((T0 + i, i + 1))
        p = progress(i + 1, i + 1, history[-3:], scope="job")
        # Both ranks follow the same log: each line is one point of the job.
        ranks = [rank(rank=0, progress=p), rank(rank=1, progress=p)]
        apply(state, report(ranks=ranks, sent_at=T0 + i), received_at=T0 + i)
    job = state.jobs["job-a"]
    assert list(job.progress_points) == [(T0 + i, i + 1) for i in range(5)]
    assert all(not t.progress_points for t in job.ranks.values())


def test_progress_without_a_cadence_list_adds_one_point_at_step_at() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank(progress=progress(3, 30, step_at=T0 - 10))], sent_at=T0 - 5), received_at=T0)
    # Same events again: no new point.
    apply(state, report(ranks=[rank(progress=progress(3, 30, step_at=T0 - 10))], sent_at=T0 - 4), received_at=T0 + 1)
    apply(state, report(ranks=[rank(progress=progress(4, 40, step_at=T0 - 3))], sent_at=T0 - 3), received_at=T0 + 2)
    assert list(state.jobs["job-a"].ranks[0].progress_points) == [(T0 - 5, 30), (T0 + 2, 40)]


def test_progress_points_carry_over_a_restarted_rank() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank(progress=progress(1, 5, [(T0, 5)]))], sent_at=T0), received_at=T0)
    restarted = rank(pid=2000, progress=progress(1, 6, [(T0 + 10, 6)]))
    apply(state, report(ranks=[restarted], sent_at=T0 + 10), received_at=T0 + 10)
    assert list(state.jobs["job-a"].ranks[0].progress_points) == [(T0, 5), (T0 + 10, 6)]


def test_a_restarted_ranks_old_exit_listed_beside_it_does_not_reset_it() -> None:
    """The agent lists an ended worker for minutes: the live one under the same rank keeps its facts."""
    state = MonitorState()
    dead = rank(rank=1, pid=1001, alive=False, state="Z", exit={"at": T0, "code": 1, "source": "pidfd"})
    for i in range(4):
        live = rank(rank=1, pid=2001, state="T", cpu_percent=0.0)
        apply(state, report(ranks=[dead, live], sent_at=T0 + 1 + i), received_at=T0 + 1 + i)
    rv = view(state, now=T0 + 4).ranks[0]
    assert (rv.pid, rv.alive, rv.exit) == (2001, True, None)
    assert (rv.state_since, rv.idle_since) == (T0 + 1, T0 + 1)


def test_a_new_run_reusing_an_ended_jobs_id_starts_clean() -> None:
    """Same MASTER_ADDR:PORT again after the last run ended: no old steps, exits or launchers."""
    state = MonitorState()
    old_ranks = [rank(rank=r, pid=1000 + r, progress=progress(3, 30, [(T0 + 1, 30)])) for r in (0, 1)]
    old_launcher = launcher(pid=900)
    apply(state, report(ranks=old_ranks, launchers=[old_launcher], sent_at=T0 + 1), received_at=T0 + 1)
    ended = [rank(rank=r, pid=1000 + r, alive=False, exit={"at": T0 + 2, "code": 1, "source": "pidfd"})
             for r in (0, 1)]
    ended_launcher = launcher(pid=900, alive=False, exit={"at": T0 + 2.1, "code": 1, "source": "pidfd"})
    apply(state, report(ranks=ended, launchers=[ended_launcher], sent_at=T0 + 3), received_at=T0 + 3)
    assert state.jobs["job-a"].ended_at is not None

    new = [rank(rank=r, pid=3000 + r) for r in (0, 1)]
    for i in range(2):  # the agent still lists the old run's processes beside the new ones
        apply(state, report(ranks=ended + new, launchers=[ended_launcher, launcher(pid=2900)], sent_at=T0 + 10 + i),
              received_at=T0 + 10 + i)
    jv = view(state, now=T0 + 12)
    assert [(r.pid, r.alive, r.exit) for r in jv.ranks] == [(3000, True, None), (3001, True, None)]
    assert [(lv.pid, lv.alive) for lv in jv.launchers] == [(2900, True)]
    assert jv.job_progress_times == () and all(r.progress_times == () for r in jv.ranks)
    assert jv.first_seen_at == T0 + 10


def test_a_job_that_ended_keeps_its_history_while_agents_list_it() -> None:
    """Only a live process starts a new run: the ended job's own late reports change nothing."""
    state = MonitorState()
    apply(state, report(ranks=[rank(rank=0, progress=progress(3, 30, [(T0 + 1, 30)]))], sent_at=T0 + 1),
          received_at=T0 + 1)
    ended = rank(rank=0, alive=False, exit={"at": T0 + 2, "code": 0, "source": "pidfd"})
    for i in range(3):
        apply(state, report(ranks=[ended], sent_at=T0 + 3 + i), received_at=T0 + 3 + i)
    [rv] = view(state, now=T0 + 6).ranks
    assert (rv.alive, rv.exit.code, rv.progress_times) == (False, 0, (T0 + 1,))


EVALUATE_FRAMES = [frame("forward", "/work/train.py", 30), frame("evaluate", "/work/train.py", 150),
                   frame("<module>", "/work/train.py", 200)]


def test_phase_marks_one_per_episode_from_log_lines_and_stacks() -> None:
    """The job's phase marks: a new phase line or a phase stack marks the silent stretch once."""
    state = MonitorState()

    def send(i: int, **fields: Any) -> None:
        apply(state, report(ranks=[rank(**fields)], sent_at=T0 + i), received_at=T0 + i)

    send(0, progress=progress(1, 10, [(T0, 10)]))
    for i in (1, 2, 3):  # three eval lines in one stretch, re-sent with every report
        line = {"phase": "evaluation", "seen_at": T0 + i, "line": f"eval batch {i}"}
        send(i, progress=progress(1, 10, [(T0, 10)]), log_phase=line)
        send(i, progress=progress(1, 10, [(T0, 10)]), log_phase=line)
    send(4, progress=progress(2, 11, [(T0 + 4, 11)]))  # a step: the stretch is over
    send(5, progress=progress(2, 11, [(T0 + 4, 11)]), stack=stack(T0 + 5, EVALUATE_FRAMES))
    send(6, progress=progress(2, 11, [(T0 + 4, 11)]),
         stack=stack(T0 + 6, [frame("_save", "/venv/lib/python3.11/site-packages/torch/serialization.py", 1)]))
    assert view(state).phase_marks == ((T0 + 1, "evaluation"), (T0 + 5, "evaluation"), (T0 + 6, "checkpoint"))


def test_a_vanished_rank_listed_again_is_the_same_run() -> None:
    """An agent that missed a rank once (so the job looked ended) and lists it again keeps its history."""
    state = MonitorState()
    apply(state, report(ranks=[rank(rank=0, progress=progress(3, 30, [(T0 + 1, 30)]))], sent_at=T0 + 1),
          received_at=T0 + 1)
    apply(state, report(ranks=[], sent_at=T0 + 2), received_at=T0 + 2)  # missed: marked vanished
    assert state.jobs["job-a"].ended_at is not None
    apply(state, report(ranks=[rank(rank=0, progress=progress(3, 30, [(T0 + 1, 30)]))], sent_at=T0 + 3),
          received_at=T0 + 3)
    [rv] = view(state, now=T0 + 4).ranks
    assert (rv.alive, rv.progress_times, rv.first_seen_at) == (True, (T0 + 1,), T0 + 1)


def test_a_dead_entry_from_another_node_does_not_replace_the_live_rank() -> None:
    """After an elastic restart rank 1 runs on node-b; node-a still lists its old, dead rank 1."""
    state = MonitorState()
    old = rank(rank=1, pid=300, alive=False, exit={"at": T0, "code": 1, "source": "pidfd"})
    for i in range(3):
        apply(state, report(node="node-b", ranks=[rank(rank=1, pid=500)], sent_at=T0 + 1 + i), received_at=T0 + 1 + i)
        apply(state, report(node="node-a", ranks=[old], sent_at=T0 + 1.5 + i), received_at=T0 + 1.5 + i)
    [rv] = view(state, now=T0 + 4).ranks
    assert (rv.node, rv.pid, rv.alive, rv.first_seen_at) == ("node-b", 500, True, T0 + 1)


def test_a_forgotten_jobs_dead_ranks_stay_out_of_the_next_run_under_its_id() -> None:
    state = MonitorState()
    apply(state, report(ranks=[rank(rank=0, pid=100)], sent_at=T0), received_at=T0)
    dead = rank(rank=0, pid=100, alive=False, exit={"at": T0 + 1, "code": 1, "source": "pidfd"})
    apply(state, report(ranks=[dead], sent_at=T0 + 1), received_at=T0 + 1)
    assert state.prune(T0 + 700, retention_s=600) == ["job-a"]
    # the agent lists the dead rank beside the new run's live one (a different rank here)
    apply(state, report(ranks=[rank(rank=1, pid=200), dead], sent_at=T0 + 701), received_at=T0 + 701)
    jv = view(state, now=T0 + 702)
    assert [(r.rank, r.pid, r.alive) for r in jv.ranks] == [(1, 200, True)]


def test_fast_steps_keep_a_long_history_of_sightings() -> None:
    """16 steps read per sighting: the history keeps two per sighting, so it spans 32 sightings
    (a pause seen half a minute ago still sets the stall threshold)."""
    from collections import deque

    from monitor.ingest.progress_ingest import _add_times
    from monitor.ingest.tracks import PROGRESS_HISTORY

    times: deque[float] = deque(maxlen=PROGRESS_HISTORY)
    for sighting in range(40):
        _add_times(times, [float(sighting)] * 16)
    assert len(set(times)) == PROGRESS_HISTORY // 2
    assert list(times)[-2:] == [39.0, 39.0]


def test_the_job_keeps_its_rhythm_from_its_ranks_cpu() -> None:
    """When a rank was first at work, and the longest pause a rank came back from (JobView)."""
    state = MonitorState()
    cpus = [0.5, 90.0, 95.0, 1.0, 0.5, 0.4, 97.0, 1.0, 99.0]  # idle at start; a 2 s pause; a 0 s one
    for i, cpu in enumerate(cpus):
        apply(state, report(ranks=[rank(cpu_percent=cpu)], sent_at=T0 + i), received_at=T0 + i)
    got = view(state, now=T0 + len(cpus))
    assert got.working_since == T0 + 1
    # Idle from the report before the first idle one (T0 + 2) to the last idle report (T0 + 5).
    assert got.longest_pause_s == pytest.approx(3.0)


def _jobs_of(*spec: tuple[str, int, float]) -> dict:
    """job id -> a JobTrack of ``ranks`` ranks last heard from at ``at``."""
    return {job_id: JobTrack(job_id, ranks=dict.fromkeys(range(ranks)), last_report_at=at) for job_id, ranks, at in spec}


@pytest.mark.parametrize(("needed", "forgotten"), [
    (2, []),  # 8 + 2 fit in 10
    (4, ["old"]),  # the longest silent goes first, and is enough
    (7, ["old", "quiet"]),
    (9, []),  # the silent jobs' 5 ranks cannot make room for 9: nobody is forgotten for nothing
])
def test_room_for_new_ranks_is_made_from_silent_jobs_only_when_it_is_enough(needed: int, forgotten: list[str]) -> None:
    jobs = _jobs_of(("old", 2, 10.0), ("quiet", 3, 20.0), ("live", 3, 99.0))
    assert make_room_for_ranks(jobs, {}, needed, max_ranks=10, now=100.0, silent_s=60.0) == forgotten
    assert set(jobs) == {"old", "quiet", "live"} - set(forgotten)


@pytest.mark.parametrize(("needed", "forgotten"), [(1, ["old"]), (2, ["old", "quiet"]), (3, [])])
def test_room_for_new_jobs_is_made_only_when_it_is_enough(needed: int, forgotten: list[str]) -> None:
    jobs = _jobs_of(("old", 2, 10.0), ("quiet", 3, 20.0), ("live", 3, 99.0))
    assert sorted(make_room_for_jobs(jobs, {}, needed, max_jobs=3, now=100.0, silent_s=60.0)) == forgotten


def _held_feed(state: MonitorState, reports: list[tuple[float, float, dict | None, float | None]]) -> None:
    """(at, process CPU, stack or None, main thread CPU) per report, one rank."""
    for at, cpu, stk, main in reports:
        threads = {"total": 3, "main_cpu_percent": main} if main is not None else None
        apply(state, report(ranks=[rank(cpu_percent=cpu, stack=stk, threads=threads)], sent_at=at), received_at=at)


SLEEPING = [frame("linger_forever", "/work/train.py", 347), frame("<module>", "/work/train.py", 90)]


def test_a_rank_is_held_from_when_it_went_idle_while_its_stacks_stay_at_one_place() -> None:
    """Issue 32: the ranks' own clock. Held from the report before CPU dropped, once a stack taken
    since shows where it is; each stack at the same place counts; the job's pass is due at once."""
    state = MonitorState()
    _held_feed(state, [(T0, 90.0, None, 40.0), (T0 + 1, 80.0, None, 30.0), (T0 + 2, 1.0, None, 0.0)])
    revision = state.jobs["job-a"].lifecycle_revision
    _held_feed(state, [(T0 + 3, 0.0, stack(T0 + 2.5), 0.0)])
    rv = view(state).ranks[0]
    assert (rv.held_stacks, rv.held_since) == (1, T0 + 1)
    assert state.jobs["job-a"].held_ranks == {0} and state.jobs["job-a"].lifecycle_revision > revision
    _held_feed(state, [(T0 + 4, 0.0, stack(T0 + 3.5), 0.0)])
    assert (view(state).ranks[0].held_stacks, view(state).ranks[0].held_since) == (2, T0 + 1)


def test_a_rank_that_moves_between_stacks_is_held_only_from_the_last_stack_elsewhere() -> None:
    state = MonitorState()
    _held_feed(state, [(T0, 90.0, None, 40.0), (T0 + 1, 1.0, None, 0.0), (T0 + 2, 0.0, stack(T0 + 1.5), 0.0),
                       (T0 + 5, 0.0, stack(T0 + 4.5, frames=SLEEPING), 0.0)])
    rv = view(state).ranks[0]
    assert (rv.held_stacks, rv.held_since) == (1, T0 + 1.5)


def test_a_main_thread_that_uses_cpu_is_not_held_however_light_the_job() -> None:
    """A light job's loop comes back to the same all_reduce line at under 10% CPU: its main thread
    still uses some CPU every second, and the hold starts over from the last report it did."""
    state = MonitorState()
    _held_feed(state, [(T0, 30.0, None, 20.0), (T0 + 1, 5.0, None, 4.0), (T0 + 2, 5.0, stack(T0 + 1.5), 4.0),
                       (T0 + 3, 5.0, stack(T0 + 2.5), 3.0)])
    rv = view(state).ranks[0]
    assert rv.held_stacks == 2 and rv.held_since == T0 + 3  # never longer than since its last CPU


def test_a_rank_at_work_or_never_seen_at_work_is_not_held() -> None:
    state = MonitorState()
    # idle from its first report: no stretch of idleness to time (a light job, a rank seen in its stall)
    _held_feed(state, [(T0, 0.0, None, 0.0), (T0 + 1, 0.0, stack(T0 + 0.5), 0.0), (T0 + 2, 0.0, stack(T0 + 1.5), 0.0)])
    assert view(state).ranks[0].held_stacks == 0 and view(state).ranks[0].held_since is None
    # at work again: the hold ends, and its length joins the job's wait profile at that site
    state = MonitorState()
    _held_feed(state, [(T0, 90.0, None, 40.0), (T0 + 1, 1.0, None, 0.0), (T0 + 2, 0.0, stack(T0 + 1.5), 0.0),
                       (T0 + 6, 0.0, stack(T0 + 5.5), 0.0), (T0 + 7, 90.0, None, 50.0)])
    assert view(state).ranks[0].held_stacks == 0 and state.jobs["job-a"].held_ranks == set()
    assert dict(view(state).pauses_by_site) == {"all_reduce@train.py:50": 6.0}

