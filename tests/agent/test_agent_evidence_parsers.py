"""Pure parsers for issue 3's evidence, table-style on fixture text: sockets, launcher argv and
job ids, error files, compute dtype, interfaces, launcher log errors; NVML through a fake module."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.discovery import allowlisted_env, launcher_kind
from agent.errorfile import parse_error_file, read_error_file
from monitor.ingest.wire import GpuReport
from agent.gpus import GpuCollector, parse_visible_devices
from agent.host import interface_reports
from agent.launchers import LauncherArgs, launcher_error, launcher_job_id, parse_launcher_args, wants_stack
from agent.logpatterns import TracebackTracker, match_dtype
from agent.sockets import listening_ports, parse_hex_ip, parse_net_tcp, select_sockets, socket_inode
from agent.stacks import parse_dump

FIXTURES = Path(__file__).parent.parent / "fixtures" / "agent"


# --- sockets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, ip",
    [
        ("0100007F", "127.0.0.1"),
        ("00000000", "0.0.0.0"),
        ("01004D0A", "10.77.0.1"),
        ("0202000A", "10.0.2.2"),
        ("00000000000000000000000000000000", "::"),
        ("00000000000000000000000001000000", "::1"),
        ("0000000000000000FFFF00000100007F", "127.0.0.1"),  # v4-mapped: shown as IPv4
        ("000000FD000000000000000002000000", "fd00::2"),
        ("000080FE00000000FF00FC00010000FE", "fe80::fc:ff:fe00:1"),
    ],
)
def test_parse_hex_ip(text, ip):
    assert parse_hex_ip(text) == ip


def test_parse_hex_ip_rejects_odd_lengths():
    with pytest.raises(ValueError):
        parse_hex_ip("0100")


def test_parse_net_tcp_real_tables():
    """Captured in a namespace: a v4 listener, an established pair over a dual-stack
    listener (v4-mapped), and a connect() whose SYNs iptables drops (state 02)."""
    v4 = parse_net_tcp((FIXTURES / "net_tcp.txt").read_text())
    v6 = parse_net_tcp((FIXTURES / "net_tcp6.txt").read_text())
    got = {i: (e.local, e.remote, e.state, e.tx_queue, e.rx_queue) for i, e in (v4 | v6).items()}
    assert got == {
        72240: ("10.77.0.1:41000", "0.0.0.0:0", "LISTEN", 0, 0),
        72238: ("127.0.0.1:35648", "127.0.0.1:29500", "ESTABLISHED", 0, 0),
        72241: ("10.77.0.1:54974", "10.77.0.1:40999", "SYN_SENT", 1, 0),
        72237: ("[::]:29500", "[::]:0", "LISTEN", 0, 0),
        72239: ("127.0.0.1:29500", "127.0.0.1:35648", "ESTABLISHED", 0, 9),
    }


def test_parse_net_tcp_skips_inode_zero_and_garbage():
    text = (FIXTURES / "net_tcp.txt").read_text().splitlines()
    time_wait = "   3: 0100007F:8F92 0100007F:A7AD 06 00000000:00000000 03:00000F5E 00000000     0        0 0 3 0"
    assert parse_net_tcp("\n".join([text[0], time_wait, "   4: garbage line with few fields"])) == {}


def test_select_sockets_most_telling_first_and_capped():
    table = parse_net_tcp((FIXTURES / "net_tcp.txt").read_text()) | parse_net_tcp(
        (FIXTURES / "net_tcp6.txt").read_text()
    )
    states = [e.state for e in select_sockets(list(table.values()))]
    assert states == ["SYN_SENT", "LISTEN", "LISTEN", "ESTABLISHED", "ESTABLISHED"]
    assert len(select_sockets(list(table.values()), cap=2)) == 2
    assert listening_ports(list(table.values())) == [29500, 41000]


@pytest.mark.parametrize(
    "link, inode",
    [("socket:[72240]", 72240), ("pipe:[123]", None), ("/dev/null", None), ("socket:[x]", None)],
)
def test_socket_inode(link, inode):
    assert socket_inode(link) == inode


# --- env and launchers --------------------------------------------------------------------


def test_allowlisted_env_keeps_only_the_listed_keys():
    env = {"MASTER_ADDR": "10.0.0.1", "GLOO_SOCKET_IFNAME": "eth0", "AWS_SECRET_ACCESS_KEY": "x", "PATH": "/bin"}
    assert allowlisted_env(env) == {"MASTER_ADDR": "10.0.0.1", "GLOO_SOCKET_IFNAME": "eth0"}


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/v/bin/python3", "/v/bin/torchrun", "--nnodes=2", "t.py"], ("torchrun", 2)),
        (["torchrun", "--standalone", "t.py"], ("torchrun", 1)),
        (["python", "-u", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"], ("torch.distributed.run", 4)),
        (["python3", "-m", "torch.distributed.launch", "t.py"], ("torch.distributed.launch", 3)),
        (["python", "train.py", "--launcher", "torchrun"], None),  # an argument, not the launcher
        (["python", "/data/torchrun_tests/train.py"], None),
        (["python", "-m", "scripts.base_train"], None),
        ([], None),
    ],
)
def test_launcher_kind(argv, expected):
    assert launcher_kind(argv) == expected


SEED_MASTER = (
    "--nnodes=2 --nproc_per_node=1 --node_rank=0 --master_addr=192.168.1.36 --master_port=29500 "
    "-m scripts.base_train -- --device-type cpu --depth 4"
).split()


@pytest.mark.parametrize(
    "argv, env, expected, job",
    [
        (SEED_MASTER, {}, LauncherArgs("2", "1", 0, "192.168.1.36", 29500), "192.168.1.36:29500"),
        (
            "--nnodes 2 --nproc-per-node 4 --node-rank 1 --master-addr node0 --master-port 29501 t.py --nnodes 9".split(),
            {},
            LauncherArgs("2", "4", 1, "node0", 29501),
            "node0:29501",
        ),
        ("--standalone --nproc_per_node=8 -m scripts.base_train".split(), {}, LauncherArgs(None, "8", standalone=True), None),
        # c10d with an id: the id is the run id
        (
            "--nnodes=1:4 --rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29400 --rdzv-id=job42 t.py".split(),
            {},
            LauncherArgs("1:4", rdzv_id="job42", rdzv_backend="c10d", rdzv_endpoint="10.0.0.1:29400"),
            "job42",
        ),
        # c10d without an id: MASTER_ADDR/PORT come from node 0's store at run time
        ("--rdzv_backend c10d --rdzv_endpoint h:1 t.py".split(), {}, LauncherArgs(rdzv_backend="c10d", rdzv_endpoint="h:1"), None),
        # single node, no port: torchrun switches to c10d with a uuid
        ("--nproc-per-node=2 t.py".split(), {}, LauncherArgs(nproc_per_node="2"), None),
        # static with an id (seen live: workers get TORCHELASTIC_RUN_ID=myjob43)
        ("--rdzv-id=myjob43 --master-port 29634 t.py".split(), {}, LauncherArgs(master_port=29634, rdzv_id="myjob43"), "myjob43"),
        # a port alone: default address 127.0.0.1
        ("--master_port 29511 t.py".split(), {}, LauncherArgs(master_port=29511), "127.0.0.1:29511"),
        # static with an explicit endpoint
        (
            "--nnodes=2 --rdzv-endpoint=[::1]:29700 t.py".split(),
            {},
            LauncherArgs("2", rdzv_endpoint="[::1]:29700"),
            "::1:29700",
        ),
        # PET_* fills what argv lacks; argv wins
        (
            "--master-port=29600 t.py".split(),
            {"PET_NNODES": "2", "PET_MASTER_ADDR": "10.1.1.1", "PET_MASTER_PORT": "1", "PET_NODE_RANK": "1"},
            LauncherArgs("2", None, 1, "10.1.1.1", 29600),
            "10.1.1.1:29600",
        ),
        ("t.py".split(), {"PET_STANDALONE": "1"}, LauncherArgs(standalone=True), None),
        # flags before the options we want do not eat them
        ("--no-python --nnodes=2 --master-port 5 /bin/prog".split(), {}, LauncherArgs("2", master_port=5), "127.0.0.1:5"),
        ([], {}, LauncherArgs(), None),
    ],
)
def test_parse_launcher_args_and_job_id(argv, env, expected, job):
    args = parse_launcher_args(argv, env)
    assert args == expected
    assert launcher_job_id(args) == job


@pytest.mark.parametrize(
    "now, since, last, expected",
    [(10.0, None, None, False), (10.0, 8.0, None, False), (10.0, 6.5, None, True), (10.0, 0.0, 6.0, False), (10.0, 0.0, 5.0, True)],
)
def test_wants_stack(now, since, last, expected):
    assert wants_stack(now, since, last) is expected


def test_launcher_errors_from_real_eaddrinuse_log():
    tracker, errors = TracebackTracker(), []
    for line in (FIXTURES / "torchrun_eaddrinuse.log").read_text().splitlines():
        if e := launcher_error(line, tracker):
            errors.append(e)
    assert errors == [
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 29690, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    ]


@pytest.mark.parametrize(
    "lines, expected",
    [
        (["[rank0]: RuntimeError: address already in use"], []),  # a worker's line
        (["E1122 00:00:00 api.py:1] failed: Address already in use"], ["E1122 00:00:00 api.py:1] failed: Address already in use"]),
        (["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "], ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]),
        (["step 5 loss 2.0"], []),
    ],
)
def test_launcher_error_lines(lines, expected):
    tracker = TracebackTracker()
    assert [e for e in (launcher_error(x, tracker) for x in lines) if e] == expected


def test_launcher_waiting_for_a_node_real_stack():
    """py-spy of torchrun --nnodes=2 --node-rank=0 whose second node never came (torch 2.13)."""
    threads = parse_dump((FIXTURES / "pyspy_launcher_waiting.json").read_text(), pid=16700)
    main = threads[0]
    assert main["name"] == "MainThread" and main["active"] is False
    assert [f["name"] for f in main["frames"][:4]] == [
        "StaticTCPRendezvous.next_rendezvous",
        "SimpleElasticAgent._rendezvous",
        "prof.<locals>.wrap.<locals>.wrapper",
        "SimpleElasticAgent._initialize_workers",
    ]
    assert main["frames"][0]["file"].endswith("torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py")


# --- error file ---------------------------------------------------------------------------


def test_parse_real_error_file():
    path = str(FIXTURES / "torchelastic_error.json")
    out = read_error_file(path)
    assert out["path"] == path and out["timestamp"] == 1795307395.0
    lines = out["message"].splitlines()
    assert lines[0] == "ValueError: bad shard count 3"
    assert lines[-2:] == ['  File "/tmp/hwx/crash.py", line 6, in inner', '    raise ValueError(f"bad shard count {x}")']
    assert not any(set(ln.strip()) <= set("^~") for ln in lines)  # 3.11's markers dropped


@pytest.mark.parametrize(
    "data, message, timestamp",
    [
        ({"message": "RuntimeError: boom"}, "RuntimeError: boom", None),  # old flat format
        ({"message": {"message": "E", "extraInfo": {"timestamp": "x"}}}, "E", None),
        ({"message": {"message": "E", "extraInfo": {"py_callstack": "a\n" * 5000 + "E\n", "timestamp": "5"}}}, None, 5.0),
        ({}, "", None),
    ],
)
def test_parse_error_file_variants(data, message, timestamp):
    out = parse_error_file(json.dumps(data), "/x/error.json")
    if message is not None:
        assert out["message"] == message
    assert len(out["message"]) <= 8192 and out["timestamp"] == timestamp


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]"])
def test_parse_error_file_garbage(text):
    assert parse_error_file(text, "/x") is None


def test_read_error_file_absent(tmp_path):
    assert read_error_file(str(tmp_path / "nope.json")) is None


# --- compute dtype ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, dtype",
    [
        ("COMPUTE_DTYPE: torch.bfloat16 (auto-detected: CUDA SM 89)", "torch.bfloat16"),
        ("COMPUTE_DTYPE: torch.float32 (from NANOCHAT_DTYPE)", "torch.float32"),
        ("model loaded, dtype=torch.bfloat16, device=cpu", "torch.bfloat16"),
        ("torch_dtype=torch.float16", "torch.float16"),
        ("Namespace(depth=4, dtype='bf16')", "torch.bfloat16"),
        ("python -m train --dtype bf16 --steps 10", "torch.bfloat16"),
        ("--dtype=float32", "torch.float32"),
        ("using bfloat16", "torch.bfloat16"),
        ("Using bf16.", "torch.bfloat16"),
        ("Using bfloat16 Automatic Mixed Precision (AMP)", "torch.bfloat16"),
        ("Using 16bit Automatic Mixed Precision (AMP)", "torch.float16"),
        ("accelerate: mixed_precision=fp16", "torch.float16"),
        ("trainer precision: bf16-mixed", "torch.bfloat16"),
        ("\x1b[32mdtype: fp32\x1b[0m", "torch.float32"),
        ("[rank0]: using half precision", "torch.float16"),
        # not announcements
        ("flags: fpu avx512_bf16 amx_bf16", None),
        ("tensor([1., 2.], dtype=torch.bfloat16)", None),
        ("index dtype=torch.int64", None),
        ("dtype=torch.float64", None),
        ("bf16 is slow on this CPU", None),
        ("step 16/32 loss 3.2", None),
        ("", None),
    ],
)
def test_match_dtype(line, dtype):
    assert match_dtype(line) == dtype


# --- interfaces ---------------------------------------------------------------------------


def test_interface_reports_bare_ips_v4_first():
    import socket

    a = lambda fam, ip: SimpleNamespace(family=fam, address=ip)  # noqa: E731
    addrs = {
        "eth0": [a(socket.AF_INET6, "fe80::1%eth0"), a(17, "aa:bb:cc:dd:ee:ff"), a(socket.AF_INET, "10.0.0.2")],
        "docker0": [a(socket.AF_INET, "172.17.0.1")],
        "lo": [a(socket.AF_INET, "127.0.0.1"), a(socket.AF_INET6, "::1")],
    }
    stats = {"eth0": SimpleNamespace(isup=True), "docker0": SimpleNamespace(isup=False), "lo": SimpleNamespace(isup=True)}
    assert interface_reports(addrs, stats) == [
        {"name": "docker0", "up": False, "addresses": ["172.17.0.1"]},
        {"name": "eth0", "up": True, "addresses": ["10.0.0.2", "fe80::1"]},
        {"name": "lo", "up": True, "addresses": ["127.0.0.1", "::1"]},
    ]


# --- GPUs through a fake NVML ------------------------------------------------------------


class FakeNvml:
    """The few pynvml calls the collector makes, over a table of devices."""

    def __init__(self, devices: list[dict]):
        self.devices = devices
        self.calls: list[str] = []

    def nvmlDeviceGetCount(self):  # noqa: N802 -- pynvml's names
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return self.devices[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802
        for d in self.devices:
            if d["uuid"] == uuid:
                return d
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    def nvmlDeviceGetIndex(self, h):  # noqa: N802
        return self.devices.index(h)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return h["name"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in h["procs"].items()]

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        self.calls.append(f"util{self.devices.index(h)}")
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(used=h["used"], total=80 << 30, free=0)

    def nvmlDeviceGetClockInfo(self, h, clock):  # noqa: N802 -- a device without clocks: NVML_ERROR_NOT_SUPPORTED
        assert clock == 1  # NVML_CLOCK_SM
        return h["clocks"][0]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):  # noqa: N802
        assert clock == 1
        return h["clocks"][1]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):  # noqa: N802
        return h["clocks"][2]


def _rank(pid, local_rank, **env):
    return SimpleNamespace(pid=pid, env=env, identity=SimpleNamespace(local_rank=local_rank))


# GPU 0 held down by a hardware thermal slowdown and its power cap (0x40 | 0x4), GPU 1 idle at full clocks
# (0x1), the others without clocks (NVML_ERROR_NOT_SUPPORTED, as on MIG slices).
CLOCKS = {0: (1050, 1980, 0x44), 1: (1980, 1980, 0x1)}


def _devices():
    return [
        {"uuid": f"GPU-{i}", "name": "NVIDIA H100", "util": u, "used": (i + 1) << 30, "procs": procs,
         "clocks": CLOCKS.get(i, {})}
        for i, (u, procs) in enumerate([(100, {101: 5 << 30}), (0, {}), (37, {}), (0, {})])
    ]


def test_gpus_from_process_list_env_and_local_rank():
    nvml = FakeNvml(_devices())
    gpus = GpuCollector(nvml=nvml)
    assert gpus.available and gpus.health() is None
    out = gpus.collect(
        [
            _rank(101, 0),  # in NVML's process list of GPU 0: its own memory
            _rank(102, 1),  # no process entry (container pids): LOCAL_RANK 1 of all devices
            _rank(103, 0, CUDA_VISIBLE_DEVICES="2"),  # one visible device
            _rank(104, 1, CUDA_VISIBLE_DEVICES="3,GPU-2"),  # by UUID
            _rank(105, None, CUDA_VISIBLE_DEVICES="0,1"),  # which one: unknown
            _rank(106, 0, CUDA_VISIBLE_DEVICES=""),  # nothing visible
            _rank(107, 0, CUDA_VISIBLE_DEVICES="GPU-unknown"),
        ]
    )
    assert out[101] == [{"index": 0, "utilization_percent": 100.0, "memory_used_bytes": 5 << 30, "name": "NVIDIA H100",
                         "sm_clock_mhz": 1050, "max_sm_clock_mhz": 1980,
                         "clock_event_reasons": ["sw_power_cap", "hw_thermal_slowdown"]}]
    assert out[102] == [{"index": 1, "utilization_percent": 0.0, "memory_used_bytes": 2 << 30, "name": "NVIDIA H100",
                         "sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "clock_event_reasons": ["gpu_idle"]}]
    assert [g["index"] for g in out[103]] == [2] and out[103][0]["utilization_percent"] == 37.0
    assert out[103][0]["sm_clock_mhz"] is None and out[103][0]["clock_event_reasons"] == []
    for gpu in (*out[101], *out[102], *out[103]):
        GpuReport.model_validate(gpu)  # what the monitor takes
    assert [g["index"] for g in out[104]] == [2]
    assert out[105] == out[106] == out[107] == []
    assert sorted(nvml.calls) == ["util0", "util1", "util2"]  # one query per device per sweep


@pytest.mark.parametrize(
    "value, expected",
    [(None, None), ("", []), ("0,1", ["0", "1"]), (" 2 , 3", ["2", "3"]), ("1,-1,2", ["1"]), ("-1", []), ("GPU-ab,1", ["GPU-ab", "1"])],
)
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value) == expected


def test_no_nvml_empty_and_health_says_why(tmp_path):
    def missing():
        raise ModuleNotFoundError("No module named 'pynvml'")

    cpu_node = GpuCollector(loader=missing, driver_paths=(str(tmp_path / "none"),))
    assert not cpu_node.available and cpu_node.collect([_rank(1, 0)]) == {}
    health = cpu_node.health()
    assert health["name"] == "gpus" and health["ok"] is True and "pynvml" in health["error"]

    (tmp_path / "nvidiactl").write_text("")
    gpu_node = GpuCollector(loader=missing, driver_paths=(str(tmp_path / "nvidiactl"),))
    assert gpu_node.health()["ok"] is False  # a driver but no metrics: worth fixing
