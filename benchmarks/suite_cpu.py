"""Where the test suite's CPU goes: run a command (the suite) and sum every process's CPU by kind.

On 2 cores the suite is bound by CPU (1.8 of the 2 cores busy from start to end), so its wall time
is the CPU it spends: this says on what. Every process on the machine is read from /proc every
``--every`` seconds (PID namespaces included: the parent namespace sees them all); a process is
put in a kind by its command line (a training rank, torchrun, a monitor, an agent, py-spy, the
pytest workers themselves, ...). What a process spent after the last reading before it ended is
missed (at most ``--every`` seconds of it: a small share for all but the shortest processes).

    python benchmarks/suite_cpu.py                      # scripts/test.sh, the whole suite
    python benchmarks/suite_cpu.py -- scripts/test.sh -m e2e
    python benchmarks/suite_cpu.py --by-test FILE         # sum a run's HANGWATCH_TEST_CPU_LOG by file, test

The second way (tests/cpu_log.py) counts what each test's worker spent and reaped, so it names the
tests to make cheaper: HANGWATCH_TEST_CPU_LOG=FILE scripts/test.sh, then --by-test FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")

# (kind, what its command line holds), the first that matches.
KINDS = (
    ("torchrun", ("torchrun", "torch.distributed.run")),
    ("monitor", ("hangwatch-monitor",)),
    ("agent", ("hangwatch-agent",)),
    ("relay", ("hangwatch-relay",)),
    ("py-spy", ("py-spy",)),
    ("training rank", ("workloads/", "multiprocessing.spawn")),
    ("pytest", ("xdist", "pytest", "node_worker", "import sys;exec(")),
    ("chromium", ("chrom",)),
    ("prometheus", ("prometheus", "promtool", "alertmanager")),
    ("containers", ("podman", "buildah", "conmon", "runc")),
)


def kind_of(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    for kind, marks in KINDS:
        if any(mark in text for mark in marks):
            return kind
    return "other: " + (os.path.basename(cmdline[0]) if cmdline else "?")


@dataclass
class Seen:
    pid: int
    started: str  # the process's start time in ticks (a pid used again is another process)
    kind: str
    cpu_s: float


def read_all(seen: dict[int, Seen], ended: list[Seen]) -> None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cpu_s = (int(fields[11]) + int(fields[12])) / TICKS
            started = fields[19]
            known = seen.get(pid)
            if known is not None and known.started == started:
                known.cpu_s = cpu_s
                continue
            cmdline = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
        if not cmdline:
            continue  # a kernel thread
        if known is not None:
            ended.append(known)
        seen[pid] = Seen(pid, started, kind_of(cmdline), cpu_s)


def by_test(path: Path, top: int) -> int:
    """The CPU each test file and each test spent, from a HANGWATCH_TEST_CPU_LOG file, most first."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    files: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for line in lines:
        name = line["test"].split("::")[0]
        files[name] += line["cpu_s"]
        counts[name] += 1
    total = sum(files.values())
    print(f"{len(lines)} tests, {total:.0f} CPU-s, {sum(x['wall_s'] for x in lines):.0f} worker-s")
    print(f"{'CPU-s':>8} {'share':>6} {'tests':>5}  file")
    for name, cpu_s in files.most_common(top):
        print(f"{cpu_s:8.1f} {cpu_s / total:6.1%} {counts[name]:5d}  {name}")
    print(f"\n{'CPU-s':>8} {'wall-s':>7}  test")
    for line in sorted(lines, key=lambda x: -x["cpu_s"])[:top]:
        print(f"{line['cpu_s']:8.1f} {line['wall_s']:7.1f}  {line['test']}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between readings (default 0.5)")
    parser.add_argument("--by-test", type=Path, metavar="FILE", help="sum a HANGWATCH_TEST_CPU_LOG file instead")
    parser.add_argument("--top", type=int, default=40, help="with --by-test: how many files and tests to list")
    parser.add_argument("command", nargs="*", help="the command to measure (default: scripts/test.sh)")
    args = parser.parse_args()
    if args.by_test:
        return by_test(args.by_test, args.top)
    command = args.command or [str(ROOT / "scripts" / "test.sh")]
    seen: dict[int, Seen] = {}
    ended: list[Seen] = []
    read_all(seen, ended)
    # What the processes already running had spent: only the rest is the command's.
    before = {(s.pid, s.started): s.cpu_s for s in seen.values()}
    started = time.monotonic()
    child = subprocess.Popen(command, cwd=ROOT)
    while child.poll() is None:
        time.sleep(args.every)
        read_all(seen, ended)
    wall = time.monotonic() - started
    spent: Counter[str] = Counter()
    processes: Counter[str] = Counter()
    for s in [*seen.values(), *ended]:
        earlier = before.get((s.pid, s.started))
        spent[s.kind] += s.cpu_s - (earlier or 0.0)
        processes[s.kind] += earlier is None
    total = sum(spent.values())
    print(f"\n{' '.join(command)}: exit {child.returncode}, {wall:.0f} s, {total:.0f} CPU-s "
          f"({total / wall:.2f} cores busy on average, {os.cpu_count()} here)")
    print(f"{'CPU-s':>8} {'share':>6} {'processes':>9}  kind")
    for kind, cpu_s in spent.most_common():
        if cpu_s >= 0.5:
            print(f"{cpu_s:8.1f} {cpu_s / total:6.1%} {processes[kind]:9d}  {kind}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
