"""Pure parsers, table-style, on fixture text."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.discovery import (
    RankIdentity,
    RankProcess,
    drop_helpers,
    is_launcher,
    is_python,
    parse_cmdline,
    parse_environ,
    rank_identity,
)
from agent.host import parse_cpuinfo
from agent.procio import parse_io
from agent.procstat import ancestors, parse_stat, summarize_threads, wait_status

FIXTURES = Path(__file__).parent.parent / "fixtures" / "agent"

# A real /proc/PID/stat line (cat), then the same with awkward comms.
STAT_CAT = (
    "3393 (cat) R 3350 3350 1915 0 -1 4194304 103 0 0 0 7 3 0 0 20 0 1 0 37306 3133440 425 "
    "18446744073709551615 94556674957312 94556674977193 140733357127536 0 0 0 0 0 0 0 0 0 17 0 0 0 "
    "0 0 0 94556674993200 94556674994816 94557325529088 140733357128415 140733357128435 "
    "140733357128435 140733357129707 0"
)


@pytest.mark.parametrize(
    "line, pid, comm, state",
    [
        (STAT_CAT, 3393, "cat", "R"),
        (STAT_CAT.replace("(cat)", "(pt_main thread)"), 3393, "pt_main thread", "R"),
        (STAT_CAT.replace("(cat)", "(a) R (b))"), 3393, "a) R (b)", "R"),
        (STAT_CAT.replace("(cat) R", "(python) Z").rsplit(" ", 1)[0] + " 2304", 3393, "python", "Z"),
    ],
)
def test_parse_stat(line, pid, comm, state):
    s = parse_stat(line)
    assert (s.pid, s.comm, s.state) == (pid, comm, state)
    assert (s.ppid, s.utime, s.stime, s.num_threads, s.starttime, s.rss_pages) == (
        3350, 7, 3, 1, 37306, 425,
    )


def test_parse_stat_exit_code_field_52():
    zombie = STAT_CAT.replace("(cat) R", "(python) Z").rsplit(" ", 1)[0] + " 768"
    assert parse_stat(zombie).exit_code == 768
    assert wait_status(768) == (3, None)


@pytest.mark.parametrize(
    "status, expected",
    [(0, (0, None)), (3 << 8, (3, None)), (9, (None, 9)), (15, (None, 15)), (9 | 0x80, (None, 9))],
)
def test_wait_status(status, expected):
    assert wait_status(status) == expected


def test_parse_stat_rejects_garbage():
    with pytest.raises(ValueError):
        parse_stat("garbage")


def test_summarize_threads_busiest_first():
    base = parse_stat(STAT_CAT)
    threads = [
        base.__class__(**{**base.__dict__, "pid": tid, "comm": name, "state": st})
        for tid, name, st in [(1, "main", "S"), (2, "gloo", "S"), (3, "busy", "R")]
    ]
    out = summarize_threads(threads, {1: 1.0, 2: None, 3: 95.0}, busiest=2, main_tid=1)
    assert out["total"] == 3 and out["by_state"] == {"S": 2, "R": 1}
    assert [t["tid"] for t in out["busiest"]] == [3, 1]
    # the main thread's own CPU, however busy the others: 0 while it sits in a collective
    assert out["main_cpu_percent"] == 1.0
    assert summarize_threads(threads, {1: 0.0, 3: 95.0}, main_tid=1)["main_cpu_percent"] == 0.0
    assert summarize_threads(threads, {1: 1.0})["main_cpu_percent"] is None


def test_parse_io():
    text = "rchar: 6976\nwchar: 80000123\nsyscr: 10\nsyscw: 0\nread_bytes: 0\nwrite_bytes: 0\n"
    io = parse_io(text)
    assert io["wchar"] == 80000123 and io["rchar"] == 6976


ENV = b"PATH=/usr/bin\0RANK=3\0WORLD_SIZE=8\0LOCAL_RANK=1\0MASTER_ADDR=10.0.0.1\0MASTER_PORT=29500\0X=a=b\0"


def test_parse_environ():
    env = parse_environ(ENV)
    assert env["RANK"] == "3" and env["X"] == "a=b" and env["MASTER_PORT"] == "29500"


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            RankIdentity("h:1", 3, 8, 1, "env", "env:RANK"),
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none",
             "TORCHELASTIC_RESTART_COUNT": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
            RankIdentity("127.0.0.1:29500", 0, 2, 0, "torchrun", "env:RANK"),
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job42", "MASTER_ADDR": "h",
             "MASTER_PORT": "1"},
            RankIdentity("job42", 1, 2, None, "torchrun", "env:RANK"),
        ),
        (
            {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "77"},
            RankIdentity("slurm:77", 5, 16, 1, "slurm", "env:SLURM_PROCID"),
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"},
            RankIdentity("local:99", 2, 4, None, "mpi", "env:OMPI_COMM_WORLD_RANK"),
        ),
        ({"RANK": "0"}, None),
        ({"RANK": "4", "WORLD_SIZE": "4"}, None),
        ({"RANK": "x", "WORLD_SIZE": "4"}, None),
        ({"PATH": "/bin"}, None),
    ],
)
def test_rank_identity(env, expected):
    assert rank_identity(env, ppid=99) == expected


@pytest.mark.parametrize(
    "exe, argv, python, launcher",
    [
        ("/usr/bin/python3.11", ["python", "train.py"], True, False),
        ("/venv/bin/python3", ["/venv/bin/python3", "/venv/bin/torchrun", "train.py"], True, True),
        ("/usr/bin/python3", ["python", "-m", "torch.distributed.run", "t.py"], True, True),
        ("/usr/bin/python3", ["python", "-m", "torch.distributed.launch", "t.py"], True, True),
        ("/usr/bin/bash", ["bash", "run.sh"], False, False),
        ("/usr/bin/python3", ["python", "/tmp/torchrun_test0/train.py"], True, False),
        ("", ["python3", "x.py"], True, False),  # exe unreadable: argv[0] decides
    ],
)
def test_python_and_launcher(exe, argv, python, launcher):
    assert is_python(exe, argv) is python
    assert is_launcher(argv) is launcher


def test_parse_cmdline():
    assert parse_cmdline(b"python\0-u\0train.py\0") == ["python", "-u", "train.py"]


def _proc(pid, ppid, rank, job="j"):
    return RankProcess(pid, ppid, 1, RankIdentity(job, rank, 4, rank, "env"), "python t.py")


@pytest.mark.parametrize(("start", "levels", "expected"), [
    (50, 6, [40, 30, 20]),  # up to, not including, init
    (50, 2, [40, 30]),  # no further than asked
    (60, 6, [55]),  # a parent nobody knows (gone) ends the walk
    (20, 6, []),  # a child of init has no ancestor worth naming
    (99, 6, []),  # an unknown process has none
])
def test_ancestors_walk_up_to_init_a_missing_parent_or_the_limit(start: int, levels: int, expected: list[int]) -> None:
    parents = {50: 40, 40: 30, 30: 20, 20: 1, 60: 55}
    assert list(ancestors(start, parents.get, levels)) == expected


def test_drop_helpers_keeps_ranks_not_their_workers():
    candidates = {
        10: _proc(10, 1, 0),
        11: _proc(11, 1, 1),
        20: _proc(20, 10, 0),  # DataLoader worker of rank 0
        30: _proc(30, 25, 1),  # grandchild of rank 1 through a non-rank process 25
        40: _proc(40, 10, 0, job="other"),  # another job's rank 0 under it: kept
    }
    parents = {10: 1, 11: 1, 20: 10, 25: 11, 30: 25, 40: 10}
    kept = drop_helpers(candidates, parents)
    assert sorted(p.pid for p in kept) == [10, 11, 40]


def test_parse_cpuinfo_real_fixture():
    model, flags = parse_cpuinfo((FIXTURES / "cpuinfo.txt").read_text())
    assert model.startswith("Intel(R) Xeon(R)")
    assert "avx2" in flags


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile", ["amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2"]),
        ("fpu sse2", []),
    ],
)
def test_parse_cpuinfo_flags(flags, expected):
    model, got = parse_cpuinfo(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n")
    assert model == "Some CPU" and got == expected
