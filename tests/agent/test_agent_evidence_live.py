"""Issue 3's evidence from real processes: sockets (also across a network namespace, with
SYN_SENT behind an iptables DROP), a real torchrun waiting for a node that never came, a real
@record crash's error file, an orphan, interfaces. Every report is checked against the wire."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from agent.sockets import SocketReader
from monitor.ingest.wire import Report
from tests.agent.conftest import children_of, run_agent_once
from hangwatch.demo.harness import free_port

pytestmark = pytest.mark.live  # starts real processes (scripts/test.sh --fast leaves it out)

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")

# A stand-in rank that listens, connects to itself, and reports its ports.
SOCKET_RANK = textwrap.dedent(
    """
    import socket, sys, time
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen()
    c = socket.create_connection(ls.getsockname()); a, _ = ls.accept()
    c.sendall(b"x" * 100)  # unread by the peer: rx_queue 100 on the accepted side
    print(ls.getsockname()[1], c.getsockname()[1], flush=True)
    time.sleep(120)
    """
)

# Connects (non-blocking) to a port whose SYNs are dropped: stays in SYN_SENT.
SYN_SENT_RANK = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket(); s.setblocking(False)
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
    except BlockingIOError:
        pass
    print(s.getsockname()[1], flush=True)
    time.sleep(120)
    """
)


def _rank_env(job_port: int, rank: int = 0, world: int = 1, **extra) -> dict:
    return {
        "PATH": os.environ.get("PATH", ""),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(job_port),
        **extra,
    }


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _rank(report: dict, pid: int) -> dict:
    return next(r for r in report["ranks"] if r["pid"] == pid)


def test_sockets_listen_and_established_with_addresses_and_queues(tmp_path):
    port = free_port()
    script = tmp_path / "sock_rank.py"
    script.write_text(SOCKET_RANK)
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=_rank_env(port, GLOO_SOCKET_IFNAME="lo", SECRET_TOKEN="x"),
        stdout=subprocess.PIPE, text=True,
    )
    try:
        listen_port, client_port = map(int, proc.stdout.readline().split())
        report = run_agent_once("--interval", "0.2", "--job", f"127.0.0.1:{port}", "--no-stacks")
        Report.model_validate(report)
        rank = _rank(report, proc.pid)
        got = {(s["local"], s["remote"], s["state"], s["rx_queue"]) for s in rank["sockets"]}
        assert got == {
            (f"127.0.0.1:{listen_port}", "0.0.0.0:0", "LISTEN", 0),
            (f"127.0.0.1:{client_port}", f"127.0.0.1:{listen_port}", "ESTABLISHED", 0),
            (f"127.0.0.1:{listen_port}", f"127.0.0.1:{client_port}", "ESTABLISHED", 100),
        }
        assert rank["sockets"][0]["state"] == "LISTEN"  # most telling first
        # The kernel's tcp_info on established connections only, with rates from the first tick's reading.
        assert rank["sockets"][0]["tcp"] is None
        assert all(s["tcp"]["rtt_ms"] is not None and s["tcp"]["bytes_acked_per_s"] is not None
                   for s in rank["sockets"] if s["state"] == "ESTABLISHED")
        assert rank["sched"]["run_queue_wait_percent"] is not None  # from the two ticks' schedstat
        assert rank["env"] == {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        lo = next(i for i in report["host"]["interfaces"] if i["name"] == "lo")
        assert lo["up"] and "127.0.0.1" in lo["addresses"]
    finally:
        _stop(proc)


needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"),
    reason="needs root, ip and iptables (apt-get install iptables)",
)


@needs_netns
def test_syn_sent_in_another_network_namespace(tmp_path):
    """A rank in its own namespace whose SYNs a firewall drops: read through /proc/PID/net."""
    ns = f"hwt-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "syn_rank.py"
    script.write_text(SYN_SENT_RANK)
    blocked = 40999
    proc = None
    try:
        for cmd in (
            ["ip", "netns", "add", ns],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "addr", "add", "10.77.0.1/24", "dev", "lo"],
            ["ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(blocked), "-j", "DROP"],
        ):
            subprocess.run(cmd, check=True, capture_output=True, timeout=10)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(script), "10.77.0.1", str(blocked)],
            env=_rank_env(blocked), stdout=subprocess.PIPE, text=True,
        )
        local_port = int(proc.stdout.readline())
        # The address exists only inside the namespace: the root namespace's tables lack it.
        with open("/proc/net/tcp") as f:
            assert "01004D0A" not in f.read()
        sockets = SocketReader().sockets_of(proc.pid)
        assert [(s.local, s.remote, s.state) for s in sockets] == [
            (f"10.77.0.1:{local_port}", f"10.77.0.1:{blocked}", "SYN_SENT")
        ]
        report = run_agent_once("--interval", "0.2", "--job", f"127.0.0.1:{blocked}", "--no-stacks")
        Report.model_validate(report)
        assert _rank(report, proc.pid)["sockets"][0]["state"] == "SYN_SENT"
    finally:
        if proc:
            _stop(proc)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


needs_torchrun = pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun not installed")


def _kill_launcher(launcher: subprocess.Popen) -> None:
    # torchrun starts workers in their own sessions: kill its children by PID, then it.
    for pid in children_of(launcher.pid):
        _kill_pid(pid)
    _stop(launcher)


@needs_torchrun
def test_real_torchrun_waiting_for_a_missing_node(tmp_path, receiver, agent_process):
    """torchrun --nnodes=2 --node-rank=0 with no second node: no workers, TCPStore listening,
    a plain py-spy stack in rendezvous."""
    port = free_port()
    job = f"127.0.0.1:{port}"
    (tmp_path / "never.py").write_text("print('never runs')\n")
    log = open(tmp_path / "torchrun.log", "w")
    argv = [TORCHRUN, "--nnodes=2", "--node-rank=0", "--nproc-per-node", "1",
            "--master-addr=127.0.0.1", f"--master-port={port}", str(tmp_path / "never.py")]
    launcher = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        agent_process("--monitor", receiver.url, "--interval", "0.3", "--job", job, "--node", "n0")
        def in_rendezvous(lr: dict) -> bool:  # torch imports slowly on a loaded machine: wait for it
            frames = lr["stack"]["threads"][0]["frames"] if lr["stack"] else []
            return bool(frames) and frames[0]["name"] == "StaticTCPRendezvous.next_rendezvous" and any(
                s["state"] == "LISTEN" for s in lr["sockets"]
            )

        report = receiver.wait_for(
            lambda r: any(lr["pid"] == launcher.pid and in_rendezvous(lr) for lr in r.get("launchers", [])),
            timeout=40,
        )
        Report.model_validate(report)
        lr = next(lr for lr in report["launchers"] if lr["pid"] == launcher.pid)
        # "t": sampled while the agent's own py-spy dumped the waiting launcher (a loaded CI machine did).
        assert lr["job_id"] == job and lr["alive"] and lr["state"] in ("S", "R", "t")
        assert (lr["nnodes"], lr["nproc_per_node"], lr["node_rank"]) == ("2", "1", 0)
        assert (lr["master_addr"], lr["master_port"]) == ("127.0.0.1", port)
        assert lr["worker_pids"] == [] and report["ranks"] == []
        assert lr["started_at"] and abs(lr["started_at"] - time.time()) < 120
        states = {(s["local"], s["state"]) for s in lr["sockets"]}
        assert (f"[::]:{port}", "LISTEN") in states or (f"0.0.0.0:{port}", "LISTEN") in states, lr["sockets"]
        assert any(s["state"] == "ESTABLISHED" and s["remote"] == job for s in lr["sockets"])  # its own store client
        stack = lr["stack"]
        assert stack["native"] is False
        top = [f["name"] for f in stack["threads"][0]["frames"][:2]]
        assert top == ["StaticTCPRendezvous.next_rendezvous", "SimpleElasticAgent._rendezvous"], top
    finally:
        _kill_launcher(launcher)


CRASHING = textwrap.dedent(
    """
    import os, sys, time
    from torch.distributed.elastic.multiprocessing.errors import record

    def load_shards(n):
        raise ValueError(f"rank {os.environ['RANK']} has {n} shards, expected 4")

    @record
    def main():
        print("COMPUTE_DTYPE: torch.bfloat16 (auto-detected: CUDA SM 89)", flush=True)
        print("step 1", flush=True)
        time.sleep(float(sys.argv[1]))
        if os.environ["RANK"] == "1":
            load_shards(1)
        time.sleep(60)

    if __name__ == "__main__":
        main()
    """
)


@needs_torchrun
def test_real_record_crash_error_file_dtype_and_launcher_exit(tmp_path, receiver, agent_process):
    port = free_port()
    job = f"127.0.0.1:{port}"
    script = tmp_path / "crash.py"
    script.write_text(CRASHING)
    log_path = tmp_path / "torchrun.log"
    log = open(log_path, "w")
    launcher = subprocess.Popen(
        [TORCHRUN, "--nproc-per-node=2", "--master-addr", "127.0.0.1", "--master-port", str(port), str(script), "3"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()
    try:
        agent_process("--monitor", receiver.url, "--interval", "0.3", "--job", job, "--no-stacks")
        report = receiver.wait_for(
            lambda r: any(x["rank"] == 1 and x["error_file"] for x in r["ranks"])
            and any(lr["pid"] == launcher.pid and not lr["alive"] for lr in r.get("launchers", [])),
            timeout=45,
        )
        Report.model_validate(report)
        rank1 = next(x for x in report["ranks"] if x["rank"] == 1)
        assert not rank1["alive"] and rank1["exit"]["code"] == 1
        ef = rank1["error_file"]
        assert ef["path"] == rank1["env"]["TORCHELASTIC_ERROR_FILE"] and ef["path"].endswith("/1/error.json")
        assert ef["message"].startswith("ValueError: rank 1 has 1 shards, expected 4\n")
        assert "in load_shards" in ef["message"] and abs(ef["timestamp"] - time.time()) < 120
        assert rank1["env"]["TORCHELASTIC_RUN_ID"] == "none" and rank1["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert rank1["compute_dtype"] == "torch.bfloat16"
        assert rank1["compute_dtype_line"] == "COMPUTE_DTYPE: torch.bfloat16 (auto-detected: CUDA SM 89)"
        rank0 = next(x for x in report["ranks"] if x["rank"] == 0)
        assert rank0["error_file"] is None  # killed by torchrun (SIGTERM): @record wrote nothing
        lr = next(lr for lr in report["launchers"] if lr["pid"] == launcher.pid)
        assert lr["job_id"] == job and lr["exit"]["code"] == 1 and lr["state"] == "X"
        assert sorted(lr["worker_pids"]) == sorted([rank0["pid"], rank1["pid"]])
        assert any("ChildFailedError" in e for e in lr["log_errors"]), (lr["log_errors"], log_path.read_text()[-3000:])
    finally:
        _kill_launcher(launcher)


ORPHAN_MAKER = textwrap.dedent(
    """
    import os, socket, subprocess, sys
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, socket, time; s = socket.socket(); "
         "s.bind(('127.0.0.1', int(os.environ.get('LISTEN_PORT', '0')))); s.listen();"
         "print(s.getsockname()[1], flush=True); time.sleep(120)"],
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        text=True,
    )
    print(child.pid, child.stdout.readline().strip(), flush=True)  # then exit: the child is orphaned
    """
)


def test_orphan_with_rank_environment_and_listening_port(tmp_path):
    port = free_port()
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_MAKER)
    maker = subprocess.Popen([sys.executable, str(script)], env=_rank_env(port, rank=1, world=2),
                             stdout=subprocess.PIPE, text=True)
    pid, listen = map(int, maker.stdout.readline().split())
    _stop(maker)
    try:
        deadline = time.time() + 5
        while time.time() < deadline:  # reparenting is immediate; be patient anyway
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == "1":
                    break
            time.sleep(0.05)
        report = run_agent_once("--interval", "0.2", "--job", f"127.0.0.1:{port}", "--no-stacks")
        Report.model_validate(report)
        orphan = next(o for o in report["orphans"] if o["pid"] == pid)
        assert orphan["listening_ports"] == [listen]
        assert "import os, socket" in orphan["cmdline"] and orphan["started_at"]
        # also a rank of the job (a stale worker); the monitor sees the same pid in both
        assert _rank(report, pid)["rank"] == 1
        # an agent watching another job leaves this job's leftover out
        other = run_agent_once("--interval", "0.2", "--job", f"127.0.0.1:{port + 1}", "--no-stacks")
        assert pid not in [o["pid"] for o in other["orphans"]]
    finally:
        _kill_pid(pid)


def test_report_json_round_trip_has_every_new_field(tmp_path):
    """Plain JSON the monitor accepts, with the new keys present even when empty."""
    report = run_agent_once("--interval", "0.1", "--job", "nothing:0", "--no-stacks")
    Report.model_validate(json.loads(json.dumps(report)))
    assert report["launchers"] == [] and report["orphans"] == [] and report["ranks"] == []
    assert report["host"]["interfaces"]
    assert "gpus" in {c["name"] for c in report["collectors"]} or any(
        r["gpus"] for r in report["ranks"]
    )


@needs_torchrun
@pytest.mark.parametrize("rank_env", ["same-job", "other-job", None],
                         ids=["stale-worker", "other-jobs-worker", "plain-listener"])
def test_stale_orphan_holds_master_port_and_torchrun_fails_eaddrinuse(rank_env, tmp_path, receiver, agent_process):
    """The seeds' launch failure: a leftover (PPID 1) still listens on the master port; a new
    torchrun on that port dies with EADDRINUSE. Both sides show in the reports -- the holder
    even without a rank's environment, because it holds a port the launcher wants."""
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_MAKER)
    # A stale worker of the last run on this port (its TCPStore still listening), or any process.
    free = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "LISTEN_PORT": str(free)}
    if rank_env:  # another job's leftover is reported once it holds the port this job wants
        env = _rank_env(free if rank_env == "same-job" else free + 1, rank=0, world=2, LISTEN_PORT=str(free))
    maker = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    pid, port = map(int, maker.stdout.readline().split())
    _stop(maker)
    job = f"127.0.0.1:{port}"
    (tmp_path / "t.py").write_text("print('never runs')\n")
    log = open(tmp_path / "torchrun.log", "w")
    launcher = None
    try:
        agent_process("--monitor", receiver.url, "--interval", "0.2", "--job", job, "--no-stacks")
        if rank_env == "same-job":  # found before any launcher wants its port
            receiver.wait_for(lambda r: any(o["pid"] == pid for o in r["orphans"]))
        else:
            # The agent is up and scanning before torchrun starts: on a loaded machine a launcher that
            # fails at once could otherwise live and die before the agent's first look.
            receiver.wait_for(lambda r: True)
        launcher = subprocess.Popen(
            [TORCHRUN, "--nnodes=1", "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
             str(tmp_path / "t.py")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        report = receiver.wait_for(
            lambda r: any(lr["pid"] == launcher.pid and not lr["alive"] and lr["log_errors"] for lr in r["launchers"])
            and any(o["pid"] == pid for o in r["orphans"]),
            timeout=30,
            describe=lambda r: (f"launchers {[(lr['pid'], lr['alive'], lr['log_errors']) for lr in r['launchers']]}, "
                                f"orphans {[o['pid'] for o in r['orphans']]} (want launcher {launcher.pid}, orphan "
                                f"{pid}); torchrun said: {(tmp_path / 'torchrun.log').read_text()[-600:]!r}"),
        )
        Report.model_validate(report)
        lr = next(lr for lr in report["launchers"] if lr["pid"] == launcher.pid)
        assert lr["job_id"] == job and lr["exit"]["code"] == 1 and lr["worker_pids"] == []
        assert any("EADDRINUSE" in e and f"port: {port}" in e for e in lr["log_errors"]), lr["log_errors"]
        orphan = next(o for o in report["orphans"] if o["pid"] == pid)
        assert orphan["listening_ports"] == [port]
    finally:
        log.close()
        if launcher:
            _kill_launcher(launcher)
        _kill_pid(pid)


def test_agent_puts_injected_nvml_gpus_into_rank_reports(ranks):
    """The runner with a fake NVML (no GPU here): per-rank GPUs, no 'gpus' health complaint."""
    from agent.gpus import GpuCollector
    from agent.runner import Agent, Config
    from tests.agent.test_agent_evidence_parsers import FakeNvml

    r0 = ranks.start(0, "sleep")
    r1 = ranks.start(1, "sleep", CUDA_VISIBLE_DEVICES="1")
    ranks.wait_for_line(1, "step 1")
    nvml = FakeNvml([
        {"uuid": "GPU-0", "name": "NVIDIA H100", "util": 0, "used": 1 << 30, "procs": {r0.pid: 3 << 30},
         "clocks": (1980, 1980, 0x1)},
        {"uuid": "GPU-1", "name": "NVIDIA H100", "util": 98, "used": 7 << 30, "procs": {}},
    ])
    agent = Agent(Config(stacks=False, jobs=frozenset({ranks.job})), gpus=GpuCollector(nvml=nvml))
    agent.discovery.self_pid = -1  # the ranks are this test's children, not the agent's helpers
    agent.start()
    try:
        agent.tick()
        report = agent.tick()
    finally:
        agent.close()
    Report.model_validate(report)
    by_pid = {r["pid"]: r for r in report["ranks"]}
    assert by_pid[r0.pid]["gpus"] == [
        {"index": 0, "utilization_percent": 0.0, "memory_used_bytes": 3 << 30, "name": "NVIDIA H100",
         "sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "clock_event_reasons": ["gpu_idle"]}
    ]
    assert [(g["index"], g["utilization_percent"]) for g in by_pid[r1.pid]["gpus"]] == [(1, 98.0)]
    assert by_pid[r1.pid]["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    health = {c["name"]: c for c in report["collectors"]}
    assert health["gpus"]["ok"] is True and health["gpus"]["error"] is None
