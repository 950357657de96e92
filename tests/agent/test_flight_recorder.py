"""PyTorch Flight Recorder dumps read by the agent (agent/flight_recorder.py, agent/flight_recorder_dump.py):
the parser on dumps torch 2.13 wrote (tests/fixtures/flight_recorder, made by make_dumps.py there)
and on garbage, where a rank's dump is, the reader on files that change, go bad or grow, and
the real agent reporting a rank's dump and never failing on a bad one."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest

from agent.delta import DeltaState
from agent.flight_recorder import FlightRecorderReader, dump_paths, recording
from agent.flight_recorder_dump import RECENT_PER_GROUP, load, parse_dump, summarize
from monitor.ingest.wire import FlightRecorderReport, Report
from tests.agent.conftest import run_agent_once

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"


def recorded(case: str, rank: int, suffix: str = "") -> bytes:
    return (FIXTURES / case / f"rank_{rank}{suffix}").read_bytes()


def counters(parsed: dict) -> list[tuple]:
    return [(g["pg"], g["desc"], g["last_enqueued"], g["last_started"], g["last_completed"]) for g in parsed["groups"]]


def ops(group: dict) -> list[tuple[int, str]]:
    return [(e["seq"], e["op"]) for e in group["recent"]]


# --- the parser, on torch's own dumps -------------------------------------------------------------

# (case, rank, [(pg, desc, last enqueued, started, completed)], the default group's last entries)
RECORDED = [
    ("stop_rank1", 0, [("0", "default_pg", 41, -1, 40), ("1", "evens", 1, -1, 1)],
     [(38, "all_reduce"), (39, "broadcast"), (40, "all_reduce"), (41, "all_reduce")]),
    ("stop_rank1", 1, [("0", "default_pg", 40, -1, 40)],
     [(37, "all_reduce"), (38, "all_reduce"), (39, "broadcast"), (40, "all_reduce")]),
    ("mismatch", 0, [("0", "default_pg", 41, -1, 39)],
     [(38, "all_reduce"), (39, "all_reduce"), (40, "all_reduce"), (41, "broadcast")]),
    ("mismatch", 1, [("0", "default_pg", 41, -1, 40)],
     [(38, "all_reduce"), (39, "all_reduce"), (40, "all_reduce"), (41, "all_reduce")]),
]


@pytest.mark.parametrize(("case", "rank", "groups", "last_ops"), RECORDED, ids=[f"{c[0]}-rank{c[1]}" for c in RECORDED])
@pytest.mark.parametrize("suffix", ["", ".json"], ids=["pickle", "json"])
def test_recorded_dumps_say_how_far_each_rank_got(case, rank, groups, last_ops, suffix):
    parsed = parse_dump(recorded(case, rank, suffix))
    assert parsed["version"] == "2.10"
    assert counters(parsed) == groups
    assert ops(parsed["groups"][0]) == last_ops
    entry = parsed["groups"][0]["recent"][-1]
    # gloo leaves every entry "scheduled"; the time is the rank's clock, in seconds.
    assert entry["state"] == "scheduled" and entry["p2p"] is False and entry["created_at"] > 1.7e9
    FlightRecorderReport.model_validate({"path": "/x", "dumped_at": 1.0, **parsed})


def test_pickle_and_json_dumps_of_one_rank_agree():
    for case, rank, *_ in RECORDED:
        assert parse_dump(recorded(case, rank)) == parse_dump(recorded(case, rank, ".json"))


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/hangwatch-fr-pwned",))


def _truncated() -> bytes:
    data = recorded("stop_rank1", 0)
    return data[: len(data) // 2]


# (what, the file's bytes, the reason given)
GARBAGE = [
    ("empty", b"", "empty file"),
    ("blank", b"  \n", "empty file"),
    ("truncated pickle (still being written)", _truncated(), "truncated"),
    ("a pickle that calls os.system", pickle.dumps(_Boom()), "refused a reference to a class or function"),
    ("a pickle that names a class", pickle.dumps(Path("/x")), "refused a reference to a class or function"),
    ("a classic GLOBAL/REDUCE exploit", b"cos\nsystem\n(S'touch /tmp/hangwatch-fr-pwned'\ntR.", "refused"),
    ("random bytes", bytes(range(256)) * 4, "not a Flight Recorder dump"),
    ("a pickled list", pickle.dumps([1, 2, 3]), "no pg_status"),
    ("pg_status not a dict", pickle.dumps({"pg_status": [1]}), "no pg_status"),
    ("invalid JSON", b'{"pg_status": {', "not a Flight Recorder dump"),
    ("JSON in another encoding", '{"version": "é"}'.encode("utf-16"), "not a Flight Recorder dump"),
]


@pytest.mark.parametrize(("what", "data", "reason"), GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_is_refused_with_a_reason_and_runs_nothing(what, data, reason, tmp_path):
    if os.path.exists("/tmp/hangwatch-fr-pwned"):
        os.unlink("/tmp/hangwatch-fr-pwned")
    with pytest.raises(ValueError, match=reason):
        parse_dump(data)
    assert not os.path.exists("/tmp/hangwatch-fr-pwned")


def test_odd_parts_of_a_dump_are_left_out_not_fatal():
    dump = {
        "version": 3,
        "pg_status": {"0": {"last_enqueued_collective": "7", "last_started_collective": True,
                            "last_completed_collective": 2**70}, 5: "not a dict"},
        "pg_config": {"0": {"ranks": "[0, 1, 2]", "desc": "ignored when entries say"}},
        "entries": ["not a dict", {"pg_id": "x"},
                    {"process_group": ["0", "mine"], "collective_seq_id": 7, "profiling_name": 12}],
    }
    parsed = summarize(dump)
    assert parsed["version"] == ""
    assert [(g["pg"], g["desc"], g["size"], g["last_enqueued"], g["last_started"], g["last_completed"])
            for g in parsed["groups"]] == [("0", "mine", 3, 7, None, None), ("5", "", None, None, None, None)]
    assert parsed["groups"][0]["recent"] == [{"seq": 7, "op": "", "state": "", "created_at": None, "p2p": False}]


def test_a_long_dump_keeps_a_few_entries_per_group_and_p2p_ids():
    entries = [{"process_group": ("0", "default_pg"), "collective_seq_id": i, "profiling_name": "nccl:all_reduce"}
               for i in range(1, 2001)]
    entries.append({"process_group": ("0", "default_pg"), "collective_seq_id": 2000, "p2p_seq_id": 9,
                    "is_p2p": True, "profiling_name": "nccl:send"})
    parsed = summarize({"pg_status": {}, "entries": entries})
    (group,) = parsed["groups"]
    assert len(group["recent"]) == RECENT_PER_GROUP
    assert ops(group)[-2:] == [(2000, "all_reduce"), (9, "send")] and group["recent"][-1]["p2p"] is True


def test_load_returns_plain_data_only():
    dump = load(recorded("stop_rank1", 1))
    assert set(dump) >= {"version", "pg_config", "pg_status", "entries"}


# --- where a rank's dump is ------------------------------------------------------------------------

HOME = {"HOME": "/home/ada"}
# (what, the rank's environment, HOME/XDG of the rank, the paths looked at for rank 3)
PATHS = [
    ("TORCH_FR_DUMP_TEMP_FILE", {"TORCH_FR_DUMP_TEMP_FILE": "/ckpt/fr_"}, HOME, ("/ckpt/fr_3",)),
    ("the old name", {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/nccl_"}, HOME, ("/tmp/nccl_3",)),
    ("the new name wins", {"TORCH_FR_DUMP_TEMP_FILE": "/a/", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/b/"}, HOME,
     ("/a/3",)),
    ("a relative prefix", {"TORCH_FR_DUMP_TEMP_FILE": "fr/rank"}, HOME, ("fr/rank3",)),
    ("a dynamic file name is the whole name",
     {"TORCH_FR_DUMP_TEMP_FILE": "/ckpt/fr.pkl", "TORCH_FR_DUMP_DYNAMIC_FILE_NAME": "1"}, HOME, ("/ckpt/fr.pkl",)),
    ("torch's default under HOME, and the older default", {}, HOME,
     ("/home/ada/.cache/torch/comm_lib_trace_rank_3", "/tmp/nccl_trace_rank_3")),
    ("XDG_CACHE_HOME first", {}, {"HOME": "/home/ada", "XDG_CACHE_HOME": "/cache"},
     ("/cache/torch/comm_lib_trace_rank_3", "/tmp/nccl_trace_rank_3")),
    ("no HOME: torch's /tmp", {}, {}, ("/tmp/.cache/torch/comm_lib_trace_rank_3", "/tmp/nccl_trace_rank_3")),
    ("a buffer of 0 turns recording off", {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/a/"}, HOME, ()),
    ("the old buffer name too", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, HOME, ()),
    ("the new buffer name wins", {"TORCH_FR_BUFFER_SIZE": "100", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0",
                                  "TORCH_FR_DUMP_TEMP_FILE": "/a/"}, HOME, ("/a/3",)),
]


@pytest.mark.parametrize(("what", "env", "home", "paths"), PATHS, ids=[p[0] for p in PATHS])
def test_dump_paths(what, env, home, paths):
    assert dump_paths(env, 3, home) == paths


def test_recording_is_on_by_default_in_torch_2_13():
    assert recording({}) and recording({"TORCH_FR_BUFFER_SIZE": "junk"}) and not recording({"TORCH_FR_BUFFER_SIZE": "-1"})


# --- the reader, on files that change -----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def reader_for(tmp_path: Path, **kw) -> tuple[FlightRecorderReader, list]:
    env = {"TORCH_FR_DUMP_TEMP_FILE": f"{tmp_path}/fr_"}
    # A pid no process has: /proc/PID/root is not there, the path is read as given.
    return FlightRecorderReader(str(tmp_path / "no-proc"), **kw), [(999_999, 0, env, None)]


def test_the_reader_reads_a_dump_once_and_again_when_it_changes(tmp_path):
    reader, ranks = reader_for(tmp_path)
    reader.collect(ranks, now=time.time())
    assert reader.latest(999_999) is None  # nothing written yet
    path = tmp_path / "fr_0"
    path.write_bytes(recorded("stop_rank1", 1))
    now = time.time() + 10
    reader.collect(ranks, now)
    got = reader.latest(999_999)
    assert got["status"] == "ok" and got["path"] == str(path) and got["size"] == path.stat().st_size
    assert got["dumped_at"] == path.stat().st_mtime and counters(got)[0][2] == 40
    FlightRecorderReport.model_validate(got)
    # Not looked at again within the interval; unchanged, the same report.
    path.write_bytes(recorded("stop_rank1", 0))
    reader.collect(ranks, now + 1)
    assert counters(reader.latest(999_999))[0][2] == 40
    reader.collect(ranks, now + 3)
    assert counters(reader.latest(999_999))[0][2] == 41
    # The file gone: the last dump read stays (it says when it was written).
    path.unlink()
    reader.collect(ranks, now + 6)
    assert counters(reader.latest(999_999))[0][2] == 41
    reader.forget(999_999)
    assert reader.latest(999_999) is None


def test_a_dump_older_than_the_process_is_a_previous_runs(tmp_path):
    reader, ranks = reader_for(tmp_path)
    path = tmp_path / "fr_0"
    path.write_bytes(recorded("stop_rank1", 1))
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    pid, rank, env, _ = ranks[0]
    reader.collect([(pid, rank, env, time.time() - 60)], time.time())
    assert reader.latest(pid) is None


def test_a_half_written_dump_waits_then_says_why(tmp_path):
    reader, ranks = reader_for(tmp_path)
    path = tmp_path / "fr_0"
    path.write_bytes(_truncated())
    reader.collect(ranks, time.time())
    assert reader.latest(999_999) is None  # fresh: maybe still being written
    reader.collect(ranks, time.time() + 5)
    got = reader.latest(999_999)
    assert got["status"].startswith("unreadable: truncated") and got["groups"] == []
    FlightRecorderReport.model_validate(got)


def test_a_dump_over_the_limit_is_not_read(tmp_path):
    reader, ranks = reader_for(tmp_path, max_bytes=1024)
    (tmp_path / "fr_0").write_bytes(recorded("stop_rank1", 1))
    reader.collect(ranks, time.time() + 5)
    assert reader.latest(999_999)["status"].startswith("too big: ")


def test_a_fifo_at_the_dump_path_never_blocks(tmp_path):
    reader, ranks = reader_for(tmp_path)
    os.mkfifo(tmp_path / "fr_0")
    started = time.monotonic()
    reader.collect(ranks, time.time())
    assert time.monotonic() - started < 1 and reader.latest(999_999) is None


def test_reading_stops_for_the_tick_when_the_budget_is_spent(tmp_path):
    clock = Clock()
    reader = FlightRecorderReader(str(tmp_path / "no-proc"), budget_s=0.5, monotonic=clock)
    env = {"TORCH_FR_DUMP_TEMP_FILE": f"{tmp_path}/fr_"}
    for r in range(3):
        (tmp_path / f"fr_{r}").write_bytes(recorded("stop_rank1", min(r, 1)))
    ranks = [(100 + r, r, env, None) for r in range(3)]
    original = reader._look

    def slow_look(*args):
        clock.t += 0.4
        original(*args)

    reader._look = slow_look
    reader.collect(ranks, time.time() + 5)
    assert [reader.latest(100 + r) is not None for r in range(3)] == [True, True, False]
    reader.collect(ranks, time.time() + 5)
    assert reader.latest(102) is not None


# --- deltas -------------------------------------------------------------------------------------


def test_a_delta_sends_a_dump_once():
    fr = {"path": "/x/fr_0", "dumped_at": 5.0, "size": 10, "status": "ok", "version": "2.10", "groups": []}
    rank = {"job_id": "j", "rank": 0, "pid": 7, "flight_recorder": fr, "env": {}, "cmdline": "", "sockets": []}
    state = DeltaState()
    full, baseline = state.compact({"host": {}, "nccl_ras": None, "ranks": [rank]})
    state.delivered(baseline, {"delta": True})
    delta, baseline = state.compact({"host": {}, "nccl_ras": None, "ranks": [rank]})
    assert delta["delta"] is True and delta["ranks"][0]["flight_recorder"] is None
    newer = dict(rank, flight_recorder=dict(fr, dumped_at=9.0))
    delta, _ = state.compact({"host": {}, "nccl_ras": None, "ranks": [newer]})
    assert delta["ranks"][0]["flight_recorder"]["dumped_at"] == 9.0


# --- the real agent -----------------------------------------------------------------------------


def test_the_agent_reports_a_ranks_dump(ranks, tmp_path):
    prefix = tmp_path / "fr_"
    proc = ranks.start(1, "sleep", world_size=2, TORCH_FR_DUMP_TEMP_FILE=str(prefix))
    ranks.wait_for_line(1, "step 1")
    (tmp_path / "fr_1").write_bytes(recorded("stop_rank1", 1))
    report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks", "--no-nccl-ras")
    Report.model_validate(report)
    (rank,) = [r for r in report["ranks"] if r["pid"] == proc.pid]
    assert rank["env"]["TORCH_FR_DUMP_TEMP_FILE"] == str(prefix)
    fr = rank["flight_recorder"]
    assert fr["status"] == "ok" and fr["path"] == f"{prefix}1"
    assert counters(fr) == [("0", "default_pg", 40, -1, 40)]
    assert all(c["ok"] for c in report["collectors"]), report["collectors"]


BAD_FILES = [
    ("truncated", _truncated(), "unreadable: truncated"),
    ("os.system inside", pickle.dumps(_Boom()), "unreadable: refused a reference to a class or function"),
    ("over 64 MiB", None, "too big: 68157440 bytes"),
]


@pytest.mark.parametrize(("what", "data", "status"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_the_agent_reports_why_a_bad_dump_is_unusable_and_goes_on(ranks, tmp_path, what, data, status):
    if os.path.exists("/tmp/hangwatch-fr-pwned"):
        os.unlink("/tmp/hangwatch-fr-pwned")
    proc = ranks.start(0, "sleep", world_size=1, TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_"))
    ranks.wait_for_line(0, "step 1")
    # Written after the rank started (an older dump is a previous run's).
    path = tmp_path / "fr_0"
    if data is None:
        with open(path, "wb") as f:
            f.truncate(65 * 1024 * 1024)  # sparse: no disk used
    else:
        path.write_bytes(data)
    time.sleep(1.1)  # settled: no longer possibly half written
    report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks", "--no-nccl-ras")
    Report.model_validate(report)
    (rank,) = [r for r in report["ranks"] if r["pid"] == proc.pid]
    assert rank["flight_recorder"]["status"].startswith(status), rank["flight_recorder"]
    assert all(c["ok"] for c in report["collectors"]), report["collectors"]
    assert not os.path.exists("/tmp/hangwatch-fr-pwned")


def test_no_flight_recorder_turns_reading_off(ranks, tmp_path):
    ranks.start(0, "sleep", world_size=1, TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_"))
    ranks.wait_for_line(0, "step 1")
    (tmp_path / "fr_0").write_bytes(recorded("stop_rank1", 1))
    report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks", "--no-nccl-ras",
                            "--no-flight-recorder")
    assert [r["flight_recorder"] for r in report["ranks"]] == [None]
    assert json.dumps(report)  # plain data


def test_a_path_that_climbs_is_not_followed(tmp_path):
    (tmp_path / "fr_0").write_bytes(recorded("stop_rank1", 1))
    reader = FlightRecorderReader(str(tmp_path / "no-proc"))
    env = {"TORCH_FR_DUMP_TEMP_FILE": f"{tmp_path}/sub/../fr_"}
    reader.collect([(999_999, 0, env, None)], time.time() + 5)
    assert reader.latest(999_999) is None


def test_another_users_file_is_not_read(tmp_path):
    """The job names the path; the agent (root) reads only files of the rank's user or root."""
    path = tmp_path / "fr_0"
    path.write_bytes(recorded("stop_rank1", 1))
    env = {"TORCH_FR_DUMP_TEMP_FILE": f"{tmp_path}/fr_"}
    reader = FlightRecorderReader("/proc")  # this test process plays the rank: it is alive
    os.chown(path, 54321, 54321)
    reader.collect([(os.getpid(), 0, env, None)], time.time() + 5)
    assert reader.latest(os.getpid()) is None
    os.chown(path, os.getuid(), os.getgid())
    reader.collect([(os.getpid(), 0, env, None)], time.time() + 10)
    assert reader.latest(os.getpid())["status"] == "ok"
