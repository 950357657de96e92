"""Who a process is in its job: the identity rules (agent/identity.py), table-style, env dicts in."""

from __future__ import annotations

import pytest

from agent.discovery import launcher_kind
from agent.identity import (
    LightningChild,
    RankIdentity,
    is_spawn_child,
    job_id,
    lightning_child,
    lightning_ranks,
    maps_torch,
    python_program,
    rank_identity,
    same_program,
    spawn_ranks,
    spawn_env_evidence,
    spawn_socket_evidence,
)
from agent.sockets import TcpEntry

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    "env, expected",
    [
        # srun without torchrun: Slurm's variables, job id with the step.
        (
            {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "77",
             "SLURM_STEP_ID": "2"},
            RankIdentity("slurm:77.2", 3, 4, 1, "slurm", "env:SLURM_PROCID"),
        ),
        # Older Slurm's SLURM_STEPID; no step at all (the batch step).
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77", "SLURM_STEPID": "0"},
         RankIdentity("slurm:77.0", 0, 2, None, "slurm", "env:SLURM_PROCID")),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77"},
         RankIdentity("slurm:77", 1, 2, None, "slurm", "env:SLURM_PROCID")),
        # An sbatch script that exports MASTER_ADDR/PORT: the rendezvous, shared by every node.
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", **MASTER},
         RankIdentity("10.0.0.1:29500", 1, 2, None, "slurm", "env:SLURM_PROCID")),
        # torchrun under srun: RANK wins over SLURM_PROCID (the node's task id), torchrun's id.
        ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
          "SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "none", **MASTER},
         RankIdentity("10.0.0.1:29500", 5, 8, 1, "torchrun", "env:RANK")),
        # Open MPI: PMIX_NAMESPACE (the mpirun job) before the master.
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
          "PMIX_RANK": "1", "PMIX_NAMESPACE": "1339490305", **MASTER},
         RankIdentity("pmix:1339490305", 1, 2, 1, "mpi", "env:OMPI_COMM_WORLD_RANK")),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", **MASTER},
         RankIdentity("10.0.0.1:29500", 0, 2, None, "mpi", "env:OMPI_COMM_WORLD_RANK")),
        # MPICH / Intel MPI (hydra): PMI_RANK / PMI_SIZE, MPI_LOCALRANKID.
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"},
         RankIdentity("local:99", 2, 4, 0, "mpi", "env:PMI_RANK")),
        # PMIx alone: PMIX_RANK with Open MPI's size.
        ({"PMIX_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "ns@1"},
         RankIdentity("pmix:ns@1", 1, 2, None, "mpi", "env:PMIX_RANK")),
        # A torchrun worker that inherited PMIX_NAMESPACE is not an MPI rank: its launcher's id.
        ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "PMIX_NAMESPACE": "ns@1", **MASTER},
         RankIdentity("10.0.0.1:29500", 0, 2, None, "torchrun", "env:RANK")),
        ({"PMI_RANK": "4", "PMI_SIZE": "4"}, None),
        ({"PMIX_RANK": "0"}, None),
        # Lightning's children have no rank variable: not for the environment rules.
        ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", **MASTER}, None),
    ],
)
def test_rank_identity_from_launcher_variables(env, expected):
    assert rank_identity(env, ppid=99) == expected


@pytest.mark.parametrize(
    "env, mpi, fallback, expected",
    [
        ({"TORCHELASTIC_RUN_ID": "job42", **MASTER, "SLURM_JOB_ID": "7"}, False, None, "job42"),
        ({"TORCHELASTIC_RUN_ID": "none", **MASTER, "SLURM_JOB_ID": "7"}, False, None, "10.0.0.1:29500"),
        ({"PMIX_NAMESPACE": "ns", **MASTER}, True, None, "pmix:ns"),
        ({"PMIX_NAMESPACE": "ns", **MASTER}, False, None, "10.0.0.1:29500"),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"}, False, None, "slurm:7.1"),
        ({"MASTER_ADDR": "h"}, False, None, "local:99"),  # half a master is none
        ({}, False, "spawn:99", "spawn:99"),
    ],
)
def test_job_id_order(env, mpi, fallback, expected):
    assert job_id(env, 99, mpi=mpi, fallback=fallback) == expected


# --- Lightning -------------------------------------------------------------------------------

LIGHTNING = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": "48007"}


@pytest.mark.parametrize(
    "env, expected",
    [
        (LIGHTNING, LightningChild(1, 0, 2, "127.0.0.1:48007")),
        ({**LIGHTNING, "NODE_RANK": "1", "WORLD_SIZE": "4"}, LightningChild(1, 1, 4, "127.0.0.1:48007")),
        ({**LIGHTNING, "LOCAL_RANK": "0"}, None),  # local rank 0 is the parent, never a child
        ({**LIGHTNING, "LOCAL_RANK": "2"}, None),  # outside the world
        ({k: v for k, v in LIGHTNING.items() if k != "NODE_RANK"}, None),
        ({**LIGHTNING, "RANK": "1"}, None),  # torchrun's worker: the environment rules
        ({**LIGHTNING, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, None),
    ],
)
def test_lightning_child(env, expected):
    assert lightning_child(env, ppid=10) == expected


@pytest.mark.parametrize(
    "parent, child, same",
    [
        # The user ran a relative path with interpreter options; Lightning re-runs an absolute one.
        (["python", "-u", "train.py", "--devices", "2"], ["/v/bin/python", "/home/u/train.py", "--devices", "2"], True),
        (["python", "-W", "ignore", "train.py"], ["/v/bin/python", "/home/u/train.py"], True),
        (["python", "-m", "pkg.train", "--x"], ["/v/bin/python", "-m", "pkg.train", "--x"], True),
        # Hydra appends its overrides.
        (["python", "train.py", "a=1"], ["/v/bin/python", "/w/train.py", "a=1", "hydra.run.dir=x"], True),
        (["python", "train.py", "--devices", "2"], ["/v/bin/python", "/w/other.py", "--devices", "2"], False),
        (["python", "train.py", "--lr", "1"], ["/v/bin/python", "/w/train.py", "--lr", "2"], False),
        (["python", "-c", "pass"], ["/v/bin/python", "-c", "pass"], False),
        (["bash"], ["/v/bin/python", "/w/train.py"], False),
    ],
)
def test_same_program(parent, child, same):
    assert same_program(parent, child) is same


def test_python_program():
    assert python_program(["python", "-X", "dev", "-B", "t.py", "-v"]) == ("t.py", ("-v",))
    assert python_program(["python", "-m"]) is None


def test_lightning_ranks_node_0_parent_is_rank_0():
    got = lightning_ranks(10, {11: LightningChild(1, 0, 2, "h:1")})
    assert got == {
        10: RankIdentity("h:1", 0, 2, 0, "lightning", "lightning:parent-of-LOCAL_RANK-children"),
        11: RankIdentity("h:1", 1, 2, 1, "lightning", "lightning:LOCAL_RANK"),
    }


def test_lightning_ranks_second_node_offsets_by_processes_per_node():
    children = {21: LightningChild(1, 1, 6, "h:1"), 22: LightningChild(2, 1, 6, "h:1")}
    got = lightning_ranks(20, children)
    assert {pid: (i.rank, i.local_rank) for pid, i in got.items()} == {20: (3, 0), 21: (4, 1), 22: (5, 2)}
    assert lightning_ranks(20, {}) == {}


# --- torch.multiprocessing.spawn -------------------------------------------------------------

SPAWN_MAIN = ["/v/bin/python", "-B", "-c",
              "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, pipe_handle=6)",
              "--multiprocessing-fork"]


@pytest.mark.parametrize(
    "argv, spawned",
    [
        (SPAWN_MAIN, True),
        (["/v/bin/python", "-c", "from multiprocessing.resource_tracker import main;main(3)"], False),
        (["/v/bin/python", "-c", "from multiprocessing.forkserver import main; main(3, 4)"], False),
        (["/v/bin/python", "train.py", "--multiprocessing-fork"], False),
        (["/v/bin/python", "train.py"], False),
    ],
)
def test_is_spawn_child(argv, spawned):
    assert is_spawn_child(argv) is spawned


def test_spawn_ranks_by_start_order_then_pid():
    # Started in one clock tick: the pid breaks the tie. An ended child keeps its place.
    got = spawn_ranks(50, [(1000, 63), (1000, 61), (999, 70)], {})
    assert {pid: i.rank for pid, i in got.items()} == {70: 0, 61: 1, 63: 2}
    assert got[61] == RankIdentity("spawn:50", 1, 3, 1, "mp.spawn", "mp.spawn:start-order")


@pytest.mark.parametrize(
    "env, job, size, ranks",
    [
        ({}, "spawn:50", 2, [0, 1]),
        ({**MASTER, "WORLD_SIZE": "4", "NODE_RANK": "1"}, "10.0.0.1:29500", 4, [2, 3]),
        ({"WORLD_SIZE": "1"}, "spawn:50", 1, [0]),  # more children than the world: the first
        ({"SLURM_JOB_ID": "7"}, "spawn:50", 2, [0, 1]),  # ranks are per node: not Slurm's job
    ],
)
def test_spawn_ranks_env(env, job, size, ranks):
    got = spawn_ranks(50, [(1, 51), (2, 52)], env)
    assert sorted(i.rank for i in got.values()) == ranks
    assert {i.job_id for i in got.values()} == {job} and {i.world_size for i in got.values()} == {size}


def _tcp(local: str, remote: str, state: str) -> TcpEntry:
    return TcpEntry(0, local, remote, state, int(local.rpartition(":")[2]), 0, 0)


@pytest.mark.parametrize(
    "sockets, evidence",
    [
        # Rank 0 serves the TCPStore, both connect to it.
        ({1: [_tcp("127.0.0.1:29500", "0.0.0.0:0", "LISTEN"), _tcp("127.0.0.1:40000", "127.0.0.1:29500", "ESTABLISHED")],
          2: [_tcp("127.0.0.1:40001", "127.0.0.1:29500", "ESTABLISHED")]}, True),
        # A rank still connecting to its sibling's store.
        ({1: [_tcp("127.0.0.1:29500", "0.0.0.0:0", "LISTEN")],
          2: [_tcp("127.0.0.1:40001", "127.0.0.1:29500", "SYN_SENT")]}, True),
        # Data-loader workers fetching over HTTPS, or one worker talking to a service: not a group.
        ({1: [_tcp("10.0.0.2:40000", "52.1.1.1:443", "ESTABLISHED")],
          2: [_tcp("10.0.0.2:40001", "52.1.1.1:443", "ESTABLISHED")]}, False),
        ({1: [_tcp("10.0.0.2:40000", "10.0.0.9:6379", "ESTABLISHED")], 2: []}, False),
        # Every worker reaching one Redis on an unprivileged port: still not a group.
        ({1: [_tcp("10.0.0.2:40000", "10.0.0.9:6379", "ESTABLISHED")],
          2: [_tcp("10.0.0.2:40001", "10.0.0.9:6379", "ESTABLISHED")]}, False),
        ({1: [], 2: []}, False),
    ],
)
def test_spawn_socket_evidence(sockets, evidence):
    assert spawn_socket_evidence(sockets) is evidence


@pytest.mark.parametrize(
    "sockets, evidence",
    [
        # Another node's master (MASTER_PORT=29500 in the environment): the children reach it.
        ({1: [_tcp("10.0.0.2:40000", "10.0.0.1:29500", "ESTABLISHED")],
          2: [_tcp("10.0.0.2:40001", "10.0.0.1:29500", "ESTABLISHED")]}, True),
        # Rank 0 of the group serves the store on MASTER_PORT.
        ({1: [_tcp("0.0.0.0:29500", "0.0.0.0:0", "LISTEN")], 2: []}, True),
        # MASTER_PORT exported by a job template, the workers talk to Redis only: no group.
        ({1: [_tcp("10.0.0.2:40000", "10.0.0.9:6379", "ESTABLISHED")],
          2: [_tcp("10.0.0.2:40001", "10.0.0.9:6379", "ESTABLISHED")]}, False),
    ],
)
def test_spawn_socket_evidence_with_master_port(sockets, evidence):
    assert spawn_socket_evidence(sockets, master_port=29500) is evidence


def test_master_variables_alone_are_no_evidence_but_world_size_is():
    assert not spawn_env_evidence([{"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, {}])
    assert spawn_env_evidence([{}, {"WORLD_SIZE": "4"}])


def test_maps_torch():
    line = "7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /v/lib/python3.11/site-packages/torch/lib/{}\n"
    assert maps_torch(line.format("libtorch_cpu.so"))
    assert not maps_torch(line.format("libc10.so") + line.format("../../numpy/core/_multiarray_umath.so"))


# --- launchers that are not ranks ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, kind",
    [
        (["/v/bin/python3", "/v/bin/accelerate", "launch", "--num_processes", "2", "t.py"], "accelerate"),
        (["/v/bin/python3", "/v/bin/accelerate", "config"], None),
        (["/v/bin/python3", "/v/bin/accelerate-launch", "t.py"], "accelerate"),
        (["python", "-m", "accelerate.commands.launch", "t.py"], "accelerate"),
        (["/v/bin/python3", "/v/bin/deepspeed", "--num_gpus", "2", "t.py"], "deepspeed"),
        (["/usr/bin/python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "t.py"], "deepspeed"),
        (["python", "train.py", "--strategy", "deepspeed"], None),  # an argument, not the launcher
        (["python", "train.py", "accelerate", "launch"], None),
    ],
)
def test_launcher_kind_of_other_launchers(argv, kind):
    found = launcher_kind(argv)
    assert (found[0] if found else None) == kind
