"""NCCL's RAS service read by the agent (agent/nccl_ras.py, agent/nccl_ras_answer.py): the parser on NCCL's recorded
answers and on garbage, the client over a real socket against a stand-in listener, and the
real agent reporting what the listener said about its rank."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from agent.nccl_ras import NcclRasPoller, NoListener, RasError, choose_address, fetch_status, parse_address, read_ras
from agent.nccl_ras_answer import local_view, parse_status, pid_map
from monitor.ingest.wire import NcclRasReport, Report
from tests.agent.conftest import run_agent_once
from tests.agent.fake_ras import FakeRas

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def recorded(case: str, suffix: str = "json") -> str:
    return (FIXTURES / f"ras-{case}.{suffix}").read_text()


@pytest.fixture
def fake_ras():
    servers: list[FakeRas] = []

    def start(answer: str = "", mode: str = "answer") -> FakeRas:
        servers.append(FakeRas(answer, mode))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.close()


# --- the parser, on NCCL's own answers ---------------------------------------------------------


def test_mismatch_answer_has_every_rank_with_its_counts_and_errors():
    parsed = parse_status(recorded("mismatch"))
    assert parsed["nccl_version"] == "2.28.9"
    (comm,) = parsed["communicators"]
    assert (comm["hash"], comm["size"], comm["ranks_count"]) == ("0xde980b285f0bb92c", 3, 3)
    assert [(r["rank"], r["pid"], r["host"]) for r in comm["ranks"]] == [
        (0, 445, "127.0.0.1"), (1, 446, "127.0.0.1"), (2, 447, "127.0.0.1")]
    # Types never launched are left out; a missing type reads as 0.
    assert [r["collective_counts"] for r in comm["ranks"]] == [
        {"Broadcast": 1, "AllReduce": 64}, {"AllReduce": 64}, {"AllReduce": 64}]
    assert [r["async_error"] for r in comm["ranks"]] == [None, "invalid usage", None]
    assert not any(r["aborted"] or r["destroyed"] or r["finalized"] for r in comm["ranks"])
    assert comm["missing_ranks"] == []


def test_idle_rank_answer_shows_the_rank_behind():
    (comm,) = parse_status(recorded("idle_rank1"))["communicators"]
    assert [r["collective_counts"]["AllReduce"] for r in comm["ranks"]] == [64, 60]


def test_invalid_json_of_a_missing_rank_is_repaired():
    text = recorded("exit_rank1")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # NCCL 2.28.9 really wrote it so
    (comm,) = parse_status(text)["communicators"]
    assert [(r["rank"], r["pid"], r["async_error"]) for r in comm["ranks"]] == [(0, 601, "remote error")]
    assert comm["missing_ranks"] == [
        {"rank": 1, "pid": 602, "host": "127.0.0.1", "unresponsive": True, "considered_dead": False}]


ANSWER = recorded("mismatch")
# (what, text, the start of the error)
GARBAGE = [
    ("empty", "", "empty answer"),
    ("blank lines", "\n\n  \n", "empty answer"),
    ("cut off halfway", ANSWER[: len(ANSWER) // 2], "invalid JSON"),
    ("binary junk", "\x00\xff\x13garbage", "invalid JSON"),
    ("an HTTP answer", "HTTP/1.1 400 Bad Request\r\n\r\n", "invalid JSON"),
    ("the text form", recorded("mismatch", "txt"), "invalid JSON"),
    ("an error line", "ERROR: Unknown command VERBOSE STATUS\n", "invalid JSON"),
    ("JSON but a list", "[1, 2, 3]", "no communicators"),
    ("JSON without communicators", '{"nccl_version": "2.28.9"}', "no communicators"),
    ("communicators not a list", '{"communicators": {"hash": 1}}', "no communicators"),
]


@pytest.mark.parametrize(("what", "text", "error"), GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_is_refused_with_a_reason(what, text, error):
    with pytest.raises(ValueError, match=error):
        parse_status(text)


def test_odd_entries_inside_an_answer_are_left_out_not_fatal():
    answer = {"communicators": [
        "not a dict",
        {"hash": "0x1", "size": "three", "ranks": []},  # no usable size
        {"hash": "0x2", "size": 2, "ranks": [
            {"rank": 0, "pid": 10, "host": "h", "collective_counts": {"AllReduce": "64", "Broadcast": -1,
                                                                    "Reduce": True, "AllGather": 3},
             "status": {"async_error": 99, "abort_flag": "yes"}},
            {"rank": "1", "pid": 11},  # a rank that is not a number
            {"pid": 12},
            7,
        ], "missing_ranks": [{"rank": 1, "pid": None, "status": []}, {"pid": 3}]},
    ]}
    (comm,) = parse_status(json.dumps(answer))["communicators"]
    (rank,) = comm["ranks"]
    assert rank["collective_counts"] == {"AllGather": 3}
    assert rank["async_error"] == "error 99" and rank["aborted"] is False
    assert comm["missing_ranks"] == [
        {"rank": 1, "pid": None, "host": "", "unresponsive": False, "considered_dead": False}]


# --- this node's ranks only ---------------------------------------------------------------------


def test_local_view_keeps_this_nodes_ranks_under_the_agents_pids():
    parsed = parse_status(recorded("mismatch"))
    # Rank 1 runs in a container here: NCCL reports its namespace pid 446, the agent knows 9446.
    (comm,) = local_view(parsed, {445: 445, 446: 9446}, {"127.0.0.1"})
    assert [(r["rank"], r["pid"]) for r in comm["ranks"]] == [(0, 445), (1, 9446)]
    assert comm["size"] == 3 and comm["ranks_count"] == 3


def test_local_view_skips_ranks_of_other_hosts_with_the_same_pid():
    answer = json.loads(recorded("idle_rank1"))
    for r in answer["communicators"][0]["ranks"]:
        r["host"] = "10.0.0.7"  # another node, whose containers give its ranks the same pids
    parsed = parse_status(json.dumps(answer))
    assert local_view(parsed, {534: 534, 535: 535}, {"10.0.0.2", "127.0.0.1"}) == []
    # With no address known to compare, the pid decides.
    assert len(local_view(parsed, {534: 534}, ())) == 1


def test_local_view_keeps_missing_ranks_and_maps_a_local_one():
    parsed = parse_status(recorded("exit_rank1"))
    (comm,) = local_view(parsed, {601: 601}, ())
    assert comm["missing_ranks"][0]["pid"] == 602  # another process's own pid: left as NCCL said
    (comm,) = local_view(parsed, {601: 601, 602: 7602}, ())
    assert comm["missing_ranks"][0]["pid"] == 7602


def test_local_view_drops_communicators_without_a_rank_here():
    assert local_view(parse_status(recorded("mismatch")), {1: 1}, ()) == []


def test_pid_map_follows_namespaces_and_drops_shared_ones():
    inner = {100: 7, 200: 7, 300: 9, 400: None}
    assert pid_map([100, 200, 300, 400], inner.get) == {100: 100, 200: 200, 300: 300, 9: 300, 400: 400}


def test_pid_map_does_not_depend_on_the_order_of_pids():
    """A host rank's pid 100 that is also a container rank's inner pid names neither, in any order."""
    inner = {100: None, 500: 100}
    for order in ([100, 500], [500, 100]):
        assert pid_map(order, inner.get) == {500: 500}


# (given, expected)
ADDRESSES = [
    ("localhost:28028", ("localhost", 28028)),
    ("127.0.0.1:29000", ("127.0.0.1", 29000)),
    ("[::1]:28028", ("::1", 28028)),
    ("::1", ("::1", 28028)),
    ("node7", ("node7", 28028)),
    ("0.0.0.0:28028", ("localhost", 28028)),
    ("[::]:28028", ("localhost", 28028)),
    ("node7:port", None),
    ("node7:0", None),
    ("node7:70000", None),
    ("", None),
    (":28028", None),
]


@pytest.mark.parametrize(("given", "expected"), ADDRESSES)
def test_parse_address(given, expected):
    assert parse_address(given) == expected


def test_address_from_the_option_else_the_ranks_else_the_default():
    envs = [{"NCCL_RAS_ADDR": "127.0.0.1:1234"}, {"NCCL_RAS_ADDR": "127.0.0.1:1234"}, {}]
    assert choose_address("10.0.0.1:99", envs) == ("10.0.0.1", 99)
    assert choose_address(None, envs) == ("127.0.0.1", 1234)
    assert choose_address(None, [{}, {"MASTER_PORT": "1"}]) == ("localhost", 28028)


# --- the client over a real socket ---------------------------------------------------------------


@pytest.mark.parametrize("case", ["mismatch", "idle_rank1", "exit_rank1"])
def test_fetch_speaks_the_protocol_and_reads_the_answer(fake_ras, case):
    server = fake_ras(recorded(case))
    text = fetch_status(server.address)
    assert text == recorded(case)
    assert server.commands == ["CLIENT PROTOCOL 2", "SET FORMAT json", "VERBOSE STATUS"]
    status, version, comms = read_ras(server.address, {445: 445, 534: 534, 601: 601}, ())
    assert (status, version, len(comms)) == ("ok", "2.28.9", 1)
    NcclRasReport.model_validate({"polled_at": 1.0, "status": status, "communicators": comms})


def _closed_port() -> tuple[str, int]:
    server = FakeRas()
    server.close()
    return server.address


def test_nothing_listening_is_no_error():
    # A port bound but not listening refuses at once, and stays ours (a closed port could be
    # taken by anyone meanwhile).
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        address = bound.getsockname()
        with pytest.raises(NoListener):  # refused, not a timeout
            fetch_status(address)
        assert read_ras(address, {}, ())[0] == "no listener"


@pytest.mark.parametrize(("mode", "answer", "error"), [
    ("hang", "", "the handshake from 127.0.0.1:\\d+ timed out"),
    ("stall", "", "the status from 127.0.0.1:\\d+ timed out"),
    ("garbage", "", "not a RAS service"),
    ("garbage", "x" * 10_000, "not a RAS service"),
    ("garbage", "SERVER PROTOCOL 2\n", "closed the connection without answering|reset by peer"),
    ("no-json", "", "no JSON output"),
])
def test_misbehaving_listeners_give_a_reason_within_the_timeouts(fake_ras, mode, answer, error):
    server = fake_ras(answer, mode)
    started = time.monotonic()
    with pytest.raises(RasError, match=error):
        fetch_status(server.address, reply_timeout=0.3, answer_timeout=0.3)
    assert time.monotonic() - started < 1.5


def test_a_partial_answer_is_a_bad_answer_not_a_crash(fake_ras):
    server = fake_ras(ANSWER[:700])
    status, _, comms = read_ras(server.address, {445: 445}, ())
    assert status.startswith("bad answer: invalid JSON") and comms == []


def test_an_answer_over_the_limit_is_refused(fake_ras):
    server = fake_ras('{"communicators": []}' + " " * 5000)
    with pytest.raises(RasError, match="larger than 1000 bytes"):
        fetch_status(server.address, max_bytes=1000)


# --- the poller: never holds up the sampling loop -------------------------------------------------


def test_the_poller_returns_at_once_while_a_listener_stalls(fake_ras):
    server = fake_ras(mode="stall")
    poller = NcclRasPoller(fetch=lambda a: fetch_status(a, answer_timeout=3))
    assert poller.start(server.address, {}, ()) is True
    # The poll runs on its own thread: start() came back while the listener still stalls.
    assert poller.start(server.address, {}, ()) is False  # one poll at a time
    assert poller.result() is None and poller.busy
    poller.wait(10)
    result = poller.result()
    assert result is not None and "timed out" in result["status"] and result["communicators"] == []


def test_the_poller_keeps_the_time_since_the_answer_last_changed(fake_ras):
    clock = iter([100.0, 103.0, 106.0])
    server = fake_ras(recorded("idle_rank1"))
    poller = NcclRasPoller(clock=lambda: next(clock))
    for _ in range(2):
        poller.start(server.address, {534: 534}, ())
        poller.wait(5)
    first = poller.result()
    assert (first["polled_at"], first["unchanged_since"], first["status"]) == (103.0, 100.0, "ok")
    server.answer = recorded("mismatch")  # another job now: nothing of this node's ranks
    poller.start(server.address, {534: 534}, ())
    poller.wait(5)
    assert (poller.result()["unchanged_since"], poller.result()["communicators"]) == (106.0, [])


def test_a_bug_in_a_poll_is_reported_not_raised():
    def broken(address):
        raise KeyError("boom")

    poller = NcclRasPoller(fetch=broken)
    poller.start(("127.0.0.1", 1), {}, ())
    poller.wait(5)
    assert poller.result()["status"] == "failed" and "KeyError" in poller.failure


# --- the real agent ---------------------------------------------------------------------------------


def _answer_for(pid: int) -> str:
    """NCCL's recorded idle_rank1 answer, its rank 0 being the process ``pid``."""
    return recorded("idle_rank1").replace('"pid": 534', f'"pid": {pid}')


def test_the_agent_reports_what_nccl_says_about_its_rank(ranks, fake_ras):
    server = fake_ras()
    proc = ranks.start(0, "sleep", world_size=2, NCCL_RAS_ADDR=server.addr)
    server.answer = _answer_for(proc.pid)
    ranks.wait_for_line(0, "step 1")

    report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks")
    Report.model_validate(report)
    ras = report["nccl_ras"]
    assert ras["status"] == "ok" and ras["address"] == server.addr and ras["nccl_version"] == "2.28.9"
    (comm,) = ras["communicators"]
    # Rank 1 (pid 535) is no process of this node: the node that runs it reports it.
    assert [(r["rank"], r["pid"], r["collective_counts"]) for r in comm["ranks"]] == [
        (0, proc.pid, {"AllReduce": 64})]
    assert all(c["ok"] for c in report["collectors"]), report["collectors"]


def test_the_agent_without_a_listener_reports_no_evidence_and_no_error(ranks):
    ranks.start(0, "sleep", world_size=1, NCCL_RAS_ADDR="%s:%d" % _closed_port())
    ranks.wait_for_line(0, "step 1")
    report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks")
    assert report["nccl_ras"]["status"] == "no listener" and report["nccl_ras"]["communicators"] == []
    assert all(c["ok"] for c in report["collectors"]), report["collectors"]


def test_the_agent_with_a_hung_listener_still_reports_at_once(ranks, fake_ras):
    server = fake_ras(mode="hang")
    ranks.start(0, "sleep", world_size=1, NCCL_RAS_ADDR=server.addr)
    ranks.wait_for_line(0, "step 1")
    started = time.monotonic()
    report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks")
    # Two ticks, the interval, the --once wait for the poll (2 s) and start-up: not stuck on the listener.
    assert time.monotonic() - started < 10
    assert report["ranks"] and report["nccl_ras"]["status"].startswith("the handshake from")


def test_no_nccl_ras_turns_polling_off(ranks, fake_ras):
    server = fake_ras(_answer_for(1))
    ranks.start(0, "sleep", world_size=1, NCCL_RAS_ADDR=server.addr)
    ranks.wait_for_line(0, "step 1")
    report = run_agent_once("--interval", "0.3", "--job", ranks.job, "--no-stacks", "--no-nccl-ras")
    assert report["nccl_ras"] is None and server.commands == []
