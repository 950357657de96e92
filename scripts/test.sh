#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest.
#
#   scripts/test.sh                   the whole suite, in parallel (HANGWATCH_TEST_WORKERS workers)
#   scripts/test.sh --fast            the pure and API tiers only (no real processes): the edit-test loop
#   scripts/test.sh -m live           one tier (tests marked live start real processes; e2e ones torch jobs)
#   scripts/test.sh tests/monitor -n0 one folder, serially
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${HANGWATCH_VENV:-.venv}
scripts/setup.sh || exit 1
# System tools the tests run for real: promtool/prometheus, chromium, iptables, systemd-analyze, mpirun.
scripts/system-deps.sh || exit 1
"$VENV/bin/ruff" check --quiet agent monitor hangwatch hangwatch_common tests benchmarks || exit 1
# Imports run only downward (pyproject.toml [tool.importlinter]).
"$VENV/bin/lint-imports" --no-cache >/dev/null || "$VENV/bin/lint-imports" --no-cache || exit 1

# Bytecode is cached as usual even where the environment turns it off (PYTHONDONTWRITEBYTECODE):
# the suite starts hundreds of monitors, agents and ranks, each of which would compile this
# project's modules again, and every worker would rewrite every test module's asserts again.
unset PYTHONDONTWRITEBYTECODE

# Most of the suite waits on real processes (verdicts, quiet windows, servers starting), so workers
# overlap well even on 2 cores. Each worker is a node of its own (tests/conftest.py).
workers=${HANGWATCH_TEST_WORKERS:-6}
args=()
tier=()
fast=0
for arg in "$@"; do
    if [ "$arg" = "--fast" ]; then
        tier=(-m "not live")  # no cpu_bound test among them: those are all live
        workers=${HANGWATCH_TEST_WORKERS:-2}
        fast=1
    else
        args+=("$arg")
    fi
done
# On a clean clone, one collection first: it compiles the project and writes the test modules'
# assertion rewrites once, where each worker and the controller would all do it at the same time
# (45 CPU-s for 6 at once, 31 for one then 6 that find it done; the suite is bound by CPU). Once the
# rewrites are cached it would only cost a collection more. The whole suite's in two halves side by
# side, one per core: 8 s against 11 s for one process here.
collect() { "$VENV/bin/python" -m pytest --collect-only -q -p no:cacheprovider "${tier[@]}" "$@" >/dev/null 2>&1 || true; }
if ! compgen -G "tests/__pycache__/conftest.*-pytest-*.pyc" >/dev/null; then
    if [ ${#args[@]} -eq 0 ]; then
        first_half=()
        second_half=()
        for path in tests/*/ tests/test_*.py; do
            path=${path%/}
            case ${path#tests/} in
                __pycache__ | fixtures) ;;
                monitor | diagnosis | terminal) first_half+=("$path") ;;
                *) second_half+=("$path") ;;
            esac
        done
        collect "${first_half[@]}" &
        collect "${second_half[@]}"
        wait
    else
        collect "${args[@]}"
    fi
fi
# Tests that judge ranks by the CPU they get (tests/conftest.py, cpu_bound) run after the parallel
# part, two at a time at most: beside the other workers' jobs a busy rank gets a fifth of a core.
# (That run imports only the test modules that name the mark.)
"$VENV/bin/python" -m pytest -n "$workers" --dist loadgroup --cpu-bound=without "${tier[@]}" "${args[@]}"
parallel=$?
cpu_bound=5
if [ "$fast" -eq 0 ] && { [ "$parallel" -le 1 ] || [ "$parallel" -eq 5 ]; }; then
    # A /tmp of its own, removed after, as each parallel worker's node has (tests/node_worker.py):
    # torchrun leaves a torchelastic_* directory behind for every job.
    serial_tmp=$(mktemp -d -t hw-serial-XXXXXX)
    TMPDIR="$serial_tmp" "$VENV/bin/python" -m pytest -n 2 --dist loadgroup --cpu-bound=only "${tier[@]}" "${args[@]}"
    cpu_bound=$?
    rm -rf "$serial_tmp"
fi
if [ "$parallel" -eq 5 ] && [ "$cpu_bound" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    exit 1
fi
for status in "$parallel" "$cpu_bound"; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
        exit "$status"
    fi
done
exit 0
