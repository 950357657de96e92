"""One sender against a real monitor, the attacks of issue 20, with figures for benchmarks/README.md.

    python benchmarks/abuse.py [--cases replay,junk,padded,headers] [--padded-seconds 20]
                               [--settle-seconds 90]
                               [--snapshot-budget BYTES] [--silent-budget BYTES] [--unguarded-headers]

- replay: an agent's numbered reports, then two old bodies re-posted verbatim in turn: how many taken.
- junk: 2,000 junk jobs, one POST each under ever new node names (a shared token allows it), then
  a real agent's new job: how long it is refused (it was for the whole 600-s job retention); and
  2,000 jobs in reports of one node name.
- padded: valid reports padded with text zlib cannot shrink, under ever new node names, from 4
  threads for ``--padded-seconds``: the database's growth (it was about 650 MB in 20 s), and the
  monitor's RSS before, at its peak and as it settles over ``--settle-seconds`` after the flood
  (it stayed at 1 GB), while one real node reports every second throughout, as a cluster's agents
  do: whether its job is still shown at the end.
- headers: 16 clients each sending 100-KB request heads three ways (one header in pieces, many
  headers, heads again and again on a keep-alive connection): the monitor's RSS before and at
  its peak (it grew from 60 to 487 MB); ``--unguarded-headers`` lifts the head limit to show the
  old behaviour.

It asserts nothing: it prints what it saw.
"""

from __future__ import annotations

import argparse
import random
import socket
import string
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "monitor"))

from monitor_reports import rank, report  # noqa: E402
from real_monitor import running_monitor  # noqa: E402

URL = "/api/v1/reports"
TOO_LARGE = 'hangwatch_monitor_snapshots_refused_total{reason="too_large"}'
OVER_BUDGET = 'hangwatch_monitor_snapshots_refused_total{reason="over_budget"}'


def _noise(size: int, rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size))


def replay(base: str) -> None:
    with httpx.Client(base_url=base, timeout=10) as http:
        bodies = [report(node="node-r", ranks=[rank(job_id="job-r")], seq=n, sent_at=time.time()) for n in range(1, 11)]
        taken = [http.post(URL, json=b).status_code for b in bodies]
        again = [http.post(URL, json=bodies[2 if i % 2 else 4]).status_code for i in range(20)]
    print(f"replay: 10 numbered reports -> {taken.count(202)} taken; 20 re-posts of two old bodies -> "
          f"{again.count(202)} taken, {again.count(409)} refused 409 (stale)")


def junk(base: str, wait_limit_s: float) -> None:
    with httpx.Client(base_url=base, timeout=10) as http:
        started = time.monotonic()
        statuses = [http.post(URL, json=report(node=f"junk-{i}", ranks=[rank(job_id=f"junk-{i}")])).status_code
                    for i in range(2000)]
        sent_s = time.monotonic() - started
        print(f"junk: 2,000 jobs under 2,000 node names in {sent_s:.1f} s: {statuses.count(202)} taken, "
              f"{statuses.count(429)} refused")
        real = report(node="node-real", ranks=[rank(job_id="job-real")])
        first = time.monotonic()
        while (status := http.post(URL, json=real).status_code) != 202 and time.monotonic() - first < wait_limit_s:
            time.sleep(0.5)
        waited = time.monotonic() - first
        print(f"junk: a real agent's new job refused for {waited:.1f} s after the junk (status {status}), "
              f"{time.monotonic() - started:.1f} s after the first junk job")
        one = [http.post(URL, json=report(node="greedy", ranks=[rank(job_id=f"greedy-{i}-{k}", rank=0)
                                                                for k in range(100)])).status_code
               for i in range(20)]
        real2 = http.post(URL, json=report(node="node-real-2", ranks=[rank(job_id="job-real-2")])).status_code
        print(f"junk: 2,000 jobs in 20 reports of one node name: {one.count(202)} taken, {one.count(429)} refused; "
              f"another real job then: {real2}")


def padded(base: str, db: Path, seconds: float, pid: int, settle_s: float) -> None:
    size_before = _db_bytes(db)
    proc = psutil.Process(pid)
    rss_before = proc.memory_info().rss
    stop = time.monotonic() + seconds
    counts = {"posted": 0, "bytes": 0}
    lock = threading.Lock()
    live_stop = threading.Event()

    def live_agent() -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            seq = 1
            while not live_stop.wait(0 if seq == 1 else 1.0):
                http.post(URL, json=report(node="node-live", ranks=[rank(job_id="job-live", world_size=1)], seq=seq))
                seq += 1

    def sender(worker: int) -> None:
        rng = random.Random(worker)
        errors = [_noise(2000, rng) for _ in range(50)]  # 100 KB of text per rank, re-used
        with httpx.Client(base_url=base, timeout=30) as http:
            n = 0
            while time.monotonic() < stop:
                ranks = [rank(job_id=f"pad-{worker}-{n}", rank=k, log_errors=errors[k:] + errors[:k]) for k in range(13)]
                body = report(node=f"pad-{worker}-{n}", ranks=ranks)
                answer = http.post(URL, json=body)
                with lock:
                    counts["posted"] += 1
                    counts["bytes"] += len(answer.request.content)
                n += 1

    live = threading.Thread(target=live_agent)
    live.start()
    threads = [threading.Thread(target=sender, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    peak = rss_before
    while any(t.is_alive() for t in threads):
        peak = max(peak, proc.memory_info().rss)
        time.sleep(0.1)
    started = time.monotonic()
    metrics = httpx.get(f"{base}/metrics", timeout=120).text
    metrics_s = time.monotonic() - started
    time.sleep(2)  # the writer thread commits what is queued

    def value(prefix: str) -> str:
        return next((line.split()[-1] for line in metrics.splitlines() if line.startswith(prefix)), "?")

    print(f"padded: {counts['posted']} reports of {counts['bytes'] / counts['posted'] / 1e6:.2f} MB under new node "
          f"names in {seconds:.0f} s ({counts['bytes'] / 1e6:.0f} MB sent): database grew "
          f"{(_db_bytes(db) - size_before) / 1e6:.0f} MB; snapshots hold "
          f"{float(value('hangwatch_monitor_snapshot_bytes ')) / 1e6:.0f} MB; snapshots not kept: "
          f"{value('hangwatch_monitor_snapshots_dropped_total')} (writer behind), "
          f"{value(TOO_LARGE)} (too large), {value(OVER_BUDGET)} (over budget); "
          f"RSS {rss_before / 2**20:.0f} -> peak {peak / 2**20:.0f} MiB; /metrics right after: {metrics_s:.2f} s")
    settling = _rss_while_idle(proc, settle_s)
    live_stop.set()
    live.join()
    live_job = httpx.get(f"{base}/diagnose", params={"job": "job-live", "format": "json"}, timeout=30).status_code
    if settling:
        print("padded: RSS after the flood: " + ", ".join(f"+{at:.0f} s {rss / 2**20:.0f}" for at, rss in settling)
              + f" MiB; settled at {settling[-1][1] / 2**20:.0f} MiB (before {rss_before / 2**20:.0f}); "
              f"the live node's job: {'shown' if live_job == 200 else f'answered {live_job}'}")


def _rss_while_idle(proc: psutil.Process, seconds: float, every_s: float = 10.0) -> list[tuple[float, int]]:
    """The process's RSS every ``every_s`` for ``seconds`` while no junk comes."""
    started = time.monotonic()
    samples = []
    while (at := time.monotonic() - started) < seconds:
        time.sleep(min(every_s, seconds - at))
        samples.append((time.monotonic() - started, proc.memory_info().rss))
    return samples


def _db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


HEAD_KINDS = {
    # one header of 100 KB, sent in 1-KB pieces
    "one 100-KB header": lambda s: (s.sendall(b"GET /diagnose HTTP/1.1\r\nHost: x\r\nX-Big: "),
                                    [s.sendall(b"a" * 1024) for _ in range(100)], s.sendall(b"\r\n\r\n")),
    # 12,000 tiny headers (100 KB)
    "12,000 headers": lambda s: s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                          + b"".join(b"X%d: a\r\n" % i for i in range(12000)) + b"\r\n"),
}


def _repeat_heads(s: socket.socket) -> None:
    """100-KB heads again and again on one keep-alive connection, for 8 s."""
    end = time.monotonic() + 8
    while time.monotonic() < end:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        if not s.recv(65536):
            return


HEAD_KINDS["100-KB heads for 8 s, keep-alive"] = _repeat_heads


def headers(base: str, pid: int) -> None:
    port = int(base.rsplit(":", 1)[1])
    proc = psutil.Process(pid)
    for kind, send in HEAD_KINDS.items():
        before = proc.memory_info().rss
        peak = [before]
        answers: list[bytes] = []

        def client() -> None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
                    send(s)
                    answers.append(s.recv(64))
            except OSError:
                answers.append(b"closed")

        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak.append(proc.memory_info().rss)
            time.sleep(0.02)
        statuses = sorted({a.split(b"\r\n")[0].decode(errors="replace") or "closed" for a in answers})
        print(f"headers: 16 clients, {kind}: RSS {before / 2**20:.0f} -> peak {max(peak) / 2**20:.0f} MiB; "
              f"answers {statuses}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="replay,junk,padded,headers")
    parser.add_argument("--padded-seconds", type=float, default=20.0)
    parser.add_argument("--settle-seconds", type=float, default=90.0, help="RSS sampled this long after the flood")
    parser.add_argument("--junk-wait-limit", type=float, default=120.0)
    parser.add_argument("--snapshot-budget", type=int, default=None, help="HANGWATCH_SNAPSHOT_BUDGET_BYTES")
    parser.add_argument("--silent-budget", type=int, default=None, help="HANGWATCH_MAX_SILENT_BYTES")
    parser.add_argument("--unguarded-headers", action="store_true", help="lift the request-head limit")
    args = parser.parse_args()
    env = {"HANGWATCH_MAX_WORLD_SIZE": "65536"}
    if args.snapshot_budget:
        env["HANGWATCH_SNAPSHOT_BUDGET_BYTES"] = str(args.snapshot_budget)
    if args.silent_budget:
        env["HANGWATCH_MAX_SILENT_BYTES"] = str(args.silent_budget)
    if args.unguarded_headers:
        env["HANGWATCH_MAX_HEADER_BYTES"] = str(1 << 30)
        env["HANGWATCH_MAX_HEADERS"] = str(1 << 20)
    cases = args.cases.split(",")
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp, running_monitor(Path(tmp), extra_env=env) as monitor:
            if case == "replay":
                replay(monitor.base)
            elif case == "junk":
                junk(monitor.base, args.junk_wait_limit)
            elif case == "padded":
                padded(monitor.base, monitor.db, args.padded_seconds, monitor.proc.pid, args.settle_seconds)
            elif case == "headers":
                headers(monitor.base, monitor.proc.pid)
            else:
                parser.error(f"no case {case!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
