#!/usr/bin/env bash
# The giant-job runs of issue 17 on a lent machine of 16 cores (the `device` tool): the monitor
# pinned to cores 0-1, the load generator and the probes on cores 2-15, so the load no longer
# competes with the monitor as on the 2-core dev machine.
#
#   benchmarks/device_giant_job.sh CASE...     CASE: deadlock | straggler | small | profile | relayed
#
# deadlock: one job of 10,000 ranks (1,250 nodes x 8), rank 1 leaves the loop a third of the way in.
# straggler: the same job, rank 1 30% slower from a third of the way in (120 s measured).
# small: 10,000 ranks in jobs of 64, for the cost per report of small jobs on the same machine.
# profile: the deadlock case with py-spy on the monitor over the measured window.
# relayed: the deadlock case with the nodes posting to 4 relays (hangwatch-relay) on cores 2-5.
# Needs the wheels of what the machine lacks in .whl (see benchmarks/README.md); figures and
# profiles go to $OUT (or /tmp/hangwatch-device).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/hangwatch-device}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir . || exit 1
export PYTHONUNBUFFERED=1
python3 -c "import monitor.web.app, monitor.web.cli" || exit 1  # a missing wheel shows here, not as "did not come up"
echo "cores: $(nproc); $(python3 --version)"
common=(--nodes 1250 --monitor-cpus 0,1 --load-cpus 2-15 --load-procs 4 --warmup 15)
for case in "$@"; do
    case $case in
        deadlock) args=(--ranks-per-job 10000 --duration 60) ;;
        straggler) args=(--ranks-per-job 10000 --fault straggler --duration 120) ;;
        small) args=(--ranks-per-job 64 --duration 60) ;;
        profile) args=(--ranks-per-job 10000 --duration 45 --py-spy "$out/profile.collapsed") ;;
        relayed) args=(--ranks-per-job 10000 --duration 60 --relays 4 --relay-cpus 2-5) ;;
        *) echo "no case named $case" >&2; exit 2 ;;
    esac
    echo "=== $case"
    taskset -c 2-15 python3 benchmarks/monitor_scale.py "${common[@]}" "${args[@]}" --json "$out/$case.json" 2>&1 |
        grep -v '^  [0-9]*: hangwatch_monitor_event_loop_probe' | tee "$out/$case.txt"
done
