"""MonitorState for multi-node hangs: launchers, sockets, wait share, orphans, interfaces."""

from __future__ import annotations

from typing import Any

import pytest
from monitor_reports import frame, launcher, orphan, rank, report, socket, stack

from monitor.diagnosis import Interface, Socket
from monitor.ingest.state import MonitorState
from monitor.engine.views import job_view
from monitor.ingest.wire import Report

T0 = 1_700_000_000.0


def apply(state: MonitorState, body: dict[str, Any], received_at: float, **kw: Any) -> set[str]:
    return state.apply(Report.model_validate(body), received_at, **kw)


def view(state: MonitorState, job: str = "job-a", now: float = T0 + 100):
    return job_view(state.jobs[job], state.nodes, now)


# --- launcher-only jobs ---


@pytest.mark.parametrize(
    ("nnodes", "nproc", "world"),
    [("2", "2", 4), ("1:4", "8", 32), ("2", "auto", 1), (None, "2", 2), ("x:y", "2", 1)],  # no --nnodes: 1
)
def test_a_launcher_alone_creates_the_job_with_a_derived_world_size(
    nnodes: str | None, nproc: str, world: int
) -> None:
    state = MonitorState()
    body = report(ranks=[], launchers=[launcher(nnodes=nnodes, nproc_per_node=nproc)], sent_at=T0)
    assert apply(state, body, T0) == {"job-a"}
    jv = view(state)
    assert jv.ranks == ()
    assert jv.world_size == world
    assert jv.first_seen_at == T0
    [lv] = jv.launchers
    assert (lv.node, lv.pid, lv.alive, lv.first_seen_at, lv.worker_count) == ("node-a", 900, True, T0, 0)
    assert lv.master_addr == "10.0.0.1" and lv.master_port == 29500
    assert "node-a" in jv.hosts


def test_ranks_world_size_wins_over_the_launchers() -> None:
    state = MonitorState()
    apply(state, report(ranks=[], launchers=[launcher(nnodes="4", nproc_per_node="2")]), T0)
    assert view(state).world_size == 8
    apply(state, report(ranks=[rank(world_size=2)], launchers=[launcher(nnodes="4", nproc_per_node="2")]), T0 + 1)
    assert view(state).world_size == 2


def test_a_launcher_without_job_id_joins_the_job_of_its_workers() -> None:
    state = MonitorState()
    body = report(ranks=[rank(rank=0, pid=1000), rank(rank=1, pid=1001)],
                  launchers=[launcher(job_id=None, worker_pids=[1000, 1001])])
    apply(state, body, T0)
    [lv] = view(state).launchers
    assert lv.worker_count == 2
    # Its workers gone, it stays with the job it had.
    apply(state, report(ranks=[], launchers=[launcher(job_id=None, worker_pids=[])]), T0 + 1)
    [lv] = view(state).launchers
    assert lv.alive and lv.worker_count == 0
    # A launcher that names no job and has no known worker is nobody's.
    apply(state, report(node="node-b", ranks=[], launchers=[launcher(job_id=None, pid=5)]), T0)
    assert set(state.jobs) == {"job-a"}


def test_a_launcher_that_vanishes_is_ended_and_its_stack_and_errors_kept() -> None:
    state = MonitorState()
    s = stack(T0, frames=[frame("_invoke_run", "/x/site-packages/torch/distributed/elastic/agent/server/api.py", 900)])
    apply(state, report(ranks=[], launchers=[launcher(stack=s, log_errors=["ChildFailedError"])], sent_at=T0), T0)
    # Another node's report says nothing about node-a's launchers.
    apply(state, report(node="node-b", ranks=[], launchers=[]), T0 + 1)
    assert view(state).launchers[0].alive
    apply(state, report(ranks=[], launchers=[]), T0 + 2)
    [lv] = view(state).launchers
    assert not lv.alive
    assert lv.exit is not None and lv.exit.at == T0 and lv.exit.error == "ChildFailedError"
    assert lv.stack is not None and lv.stack.frames[0].name == "_invoke_run"
    assert state.jobs["job-a"].ended_at == T0


def test_a_launcher_exit_is_put_on_the_monitor_clock() -> None:
    state = MonitorState()
    ended = launcher(alive=False, exit={"at": T0 - 501, "code": 1, "source": "proc"})
    apply(state, report(ranks=[], launchers=[ended], sent_at=T0 - 500), T0)
    [lv] = view(state).launchers
    assert lv.exit is not None and lv.exit.at == pytest.approx(T0 - 1) and lv.exit.code == 1


def test_a_live_launcher_keeps_the_job_from_ending() -> None:
    state = MonitorState()
    dead = rank(alive=False, exit={"at": T0, "code": 1})
    apply(state, report(ranks=[dead], launchers=[launcher()], sent_at=T0), T0)
    assert state.jobs["job-a"].ended_at is None
    apply(state, report(ranks=[dead], launchers=[launcher(alive=False, exit={"at": T0 + 1, "code": 1})],
                        sent_at=T0 + 2), T0 + 2)
    assert state.jobs["job-a"].ended_at == T0 + 1


# --- sockets ---


def test_socket_since_stays_put_and_resets_when_the_state_changes() -> None:
    state = MonitorState()
    syn = socket("10.0.0.2:41000", "10.0.0.1:29500", "SYN_SENT")
    listen = socket("0.0.0.0:29500", "0.0.0.0:0", "LISTEN")
    for i in range(3):
        apply(state, report(ranks=[rank(sockets=[syn, listen])], sent_at=T0 + i), T0 + i)
    apply(state, report(ranks=[rank(sockets=[listen, {**syn, "state": "ESTABLISHED"}])], sent_at=T0 + 3), T0 + 3)
    sockets = {s.state: s for s in view(state).ranks[0].sockets}
    assert sockets["LISTEN"] == Socket("0.0.0.0:29500", "0.0.0.0:0", "LISTEN", since=T0)
    assert sockets["ESTABLISHED"].since == T0 + 3
    assert "SYN_SENT" not in sockets
    assert sockets["ESTABLISHED"].remote_port == 29500
    apply(state, report(ranks=[rank(sockets=[])], sent_at=T0 + 4), T0 + 4)
    assert view(state).ranks[0].sockets == ()


def test_launcher_sockets_carry_since_too() -> None:
    state = MonitorState()
    syn = socket("10.0.0.2:41000", "10.0.0.1:29400", "SYN_SENT")
    for i in range(3):
        apply(state, report(ranks=[], launchers=[launcher(sockets=[syn])], sent_at=T0 + i), T0 + i)
    assert view(state).launchers[0].sockets == (Socket("10.0.0.2:41000", "10.0.0.1:29400", "SYN_SENT", T0),)


# --- collective wait share ---

COMPUTE_FRAMES = [frame("forward", "/work/model.py", 20), frame("train_step", "/work/train.py", 48)]


def test_wait_share_counts_each_distinct_stack_once() -> None:
    state = MonitorState()
    waiting = [True, False, True, True, False, True]
    for i, w in enumerate(waiting):
        s = stack(T0 + i, active=False) if w else stack(T0 + i, frames=COMPUTE_FRAMES, active=True)
        # The agent re-sends its latest stack with each report: the same sample twice counts once.
        for k in range(2):
            apply(state, report(ranks=[rank(stack=s)], sent_at=T0 + i + 0.5 * k), T0 + i + 0.5 * k)
        if i < 4:
            assert view(state, now=T0 + i).ranks[0].collective_wait_share is None  # fewer than 5 samples
    rv = view(state, now=T0 + 6).ranks[0]
    assert rv.collective_wait_share == pytest.approx(4 / 6)


def test_wait_share_forgets_samples_older_than_ten_minutes() -> None:
    state = MonitorState()
    for i in range(5):
        apply(state, report(ranks=[rank(stack=stack(T0 + i))], sent_at=T0 + i), T0 + i)
    for i in range(5):
        t = T0 + 300 + i
        apply(state, report(ranks=[rank(stack=stack(t, frames=COMPUTE_FRAMES, active=True))], sent_at=t), t)
    assert view(state, now=T0 + 305).ranks[0].collective_wait_share == pytest.approx(0.5)
    # The window ends at the rank's latest report (its view is kept until it reports again).
    for t in (T0 + 700, T0 + 1000):
        apply(state, report(ranks=[rank(stack=stack(t, frames=COMPUTE_FRAMES, active=True))], sent_at=t), t)
        if t == T0 + 700:
            assert view(state, now=t).ranks[0].collective_wait_share == pytest.approx(0.0)
    assert view(state, now=T0 + 1000).ranks[0].collective_wait_share is None  # 2 samples in the window


def test_wait_share_uses_the_diagnosis_hook_when_given() -> None:
    state = MonitorState()
    for i in range(5):
        apply(state, report(ranks=[rank(stack=stack(T0 + i))], sent_at=T0 + i), T0 + i, wait_site=lambda s, c: None)
    assert view(state, now=T0 + 5).ranks[0].collective_wait_share == 0.0


# --- orphans, interfaces, nodes reporting ---


def test_orphans_reach_only_the_jobs_on_their_node() -> None:
    state = MonitorState()
    stale = orphan(4242, "torchrun --master-port 29500 train.py", [29500])
    apply(state, report(node="node-a", ranks=[rank(job_id="job-a")], orphans=[stale]), T0)
    apply(state, report(node="node-b", ranks=[rank(job_id="job-b")]), T0)
    # A launcher-only job on node-a sees node-a's orphans too.
    apply(state, report(node="node-c", ranks=[], launchers=[launcher(job_id="job-c")]), T0)
    apply(state, report(node="node-a", ranks=[rank(job_id="job-a")], launchers=[launcher(job_id="job-c", pid=7)],
                        orphans=[stale]), T0 + 1)
    [o] = view(state, "job-a").orphans
    assert (o.node, o.pid, o.cmdline, o.listening_ports) == ("node-a", 4242, stale["cmdline"], (29500,))
    assert view(state, "job-b").orphans == ()
    assert [o.pid for o in view(state, "job-c").orphans] == [4242]
    # Gone from the node's latest report, gone from the view.
    apply(state, report(node="node-a", ranks=[rank(job_id="job-a")]), T0 + 2)
    assert view(state, "job-a").orphans == ()


def test_interfaces_are_host_facts_with_bare_addresses() -> None:
    state = MonitorState()
    host = {"cpu_flags": [], "interfaces": [
        {"name": "eth0", "up": True, "addresses": ["10.0.0.1/24", "fe80::1/64"]},
        {"name": "docker0", "up": False, "addresses": ["172.17.0.1/16"]},
    ]}
    apply(state, report(ranks=[rank()], host=host), T0)
    assert view(state).hosts["node-a"].interfaces == (
        Interface("eth0", ("10.0.0.1", "fe80::1"), True),
        Interface("docker0", ("172.17.0.1",), False),
    )


def test_nodes_reporting_are_those_heard_from_recently() -> None:
    state = MonitorState()
    apply(state, report(node="node-a", ranks=[rank()]), T0)
    apply(state, report(node="node-b", ranks=[]), T0 + 5)
    assert view(state, now=T0 + 8).nodes_reporting == frozenset({"node-a", "node-b"})
    assert view(state, now=T0 + 12).nodes_reporting == frozenset({"node-b"})
    # An agent that reports every 10 s counts as reporting for three of its intervals.
    slow = {"interval_s": 10.0, "py_spy": "ok"}
    apply(state, report(node="node-c", ranks=[], agent=slow), T0)
    assert "node-c" in view(state, now=T0 + 25).nodes_reporting


# --- per-rank facts ---


def test_env_error_file_dtype_and_gpus_reach_the_rank_view() -> None:
    state = MonitorState()
    r = rank(
        env={"MASTER_ADDR": "10.0.0.1", "GLOO_SOCKET_IFNAME": "docker0"},
        error_file={"path": "/tmp/err.json", "message": "RuntimeError: Work::getFuture not implemented"},
        compute_dtype="torch.bfloat16",
        compute_dtype_line="COMPUTE_DTYPE: torch.bfloat16",
        gpus=[{"index": 0, "utilization_percent": 100.0}, {"index": 1, "utilization_percent": 50.0}, {"index": 2}],
    )
    apply(state, report(ranks=[r]), T0)
    # Facts an agent may send only once stay; per-report ones follow the latest report.
    apply(state, report(ranks=[rank()]), T0 + 1)
    rv = view(state).ranks[0]
    assert rv.env_value("GLOO_SOCKET_IFNAME") == "docker0"
    assert rv.env == (("GLOO_SOCKET_IFNAME", "docker0"), ("MASTER_ADDR", "10.0.0.1"))
    assert rv.error_file_message == "RuntimeError: Work::getFuture not implemented"
    assert (rv.compute_dtype, rv.compute_dtype_line) == ("torch.bfloat16", "COMPUTE_DTYPE: torch.bfloat16")
    assert rv.gpu_utilization_percent is None
    apply(state, report(ranks=[rank(gpus=r["gpus"])]), T0 + 2)
    assert view(state).ranks[0].gpu_utilization_percent == pytest.approx(75.0)


def _host(hostname: str, address: str) -> dict:
    return {"hostname": hostname, "cpu_count": 8, "cpu_flags": [], "cpu_model": "Test CPU",
            "interfaces": [{"name": "lo", "addresses": ["127.0.0.1/8"]},
                           {"name": "eth0", "addresses": [f"{address}/24"]}]}


@pytest.mark.parametrize(
    ("master_on_a", "master_on_b", "one_job"),
    [
        ("node-a:29500", "10.0.0.1:29500", True),  # the master's name on one node, its address on the other
        ("10.0.0.1:29500", "node-a.cluster.example:29500", True),  # a fully qualified name
        ("node-a:29500", "10.0.0.2:29500", False),  # node-b's own address: another rendezvous
        ("node-a:29500", "10.0.0.1:29501", False),  # another port
        ("localhost:29500", "127.0.0.1:29500", False),  # loopback names every node: never joined
        ("node-a:29500", "10.0.0.99:29500", False),  # an address no reporting node has
        ("node-a.site-1:29500", "node-a.site-2:29500", False),  # two full names must match whole
        ("node-a:29500", "172.17.0.1:29500", False),  # docker0's address: on both nodes
    ],
)
def test_job_ids_naming_one_rendezvous_differently_are_one_job(master_on_a, master_on_b, one_job) -> None:
    state = MonitorState()
    host_a, host_b = _host("node-a", "10.0.0.1"), _host("node-b", "10.0.0.2")
    for host in (host_a, host_b):
        host["interfaces"].append({"name": "docker0", "addresses": ["172.17.0.1/16"]})
    if master_on_a.startswith("node-a.site-1"):
        host_a["hostname"] = "node-a.site-1"
    a = report(node="node-a", host=host_a,
               ranks=[rank(job_id=master_on_a, rank=r, world_size=4, pid=100 + r) for r in (0, 1)])
    b = report(node="node-b", host=host_b,
               ranks=[rank(job_id=master_on_b, rank=r, world_size=4, pid=100 + r) for r in (2, 3)])
    apply(state, a, received_at=T0)
    apply(state, b, received_at=T0 + 0.5)
    apply(state, b, received_at=T0 + 1.5)  # an alias, once made, holds
    if one_job:
        assert list(state.jobs) == [master_on_a]
        assert sorted(state.jobs[master_on_a].ranks) == [0, 1, 2, 3]
        assert state.jobs[master_on_a].aliases == {master_on_b}
    else:
        assert sorted(state.jobs) == sorted({master_on_a, master_on_b})


def test_each_rank_view_carries_its_cpu_level_once_half_a_minute_of_reports_is_in() -> None:
    state = MonitorState()
    for i in range(25):
        t = T0 + i
        apply(state, report(ranks=[rank(rank=0, cpu_percent=75.0), rank(rank=1, cpu_percent=98.0 if i % 7 else 20.0)],
                            sent_at=t), t)
        if i < 20:
            assert view(state, now=t).ranks[0].cpu_level_percent is None  # under 20 s of samples
    levels = [r.cpu_level_percent for r in view(state, now=T0 + 24).ranks]
    # The median: rank 1's dips (one report in seven) leave its level where its steps put it.
    assert levels == [75.0, 98.0]
