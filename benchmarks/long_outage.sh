#!/usr/bin/env bash
# The monitor outage of tests/e2e/test_outages.py at a length the suite does not spend: the suite runs
# it for 20 s (the agent's retry backoff is capped at 4 s, so 20 s already retries at the cap); this
# runs it for minutes, serially, and prints how soon the verdicts were right after the restart.
#
#   benchmarks/long_outage.sh [SECONDS ...]     (default: 120 600)
set -euo pipefail
cd "$(dirname "$0")/.."
for seconds in "${@:-120 600}"; do
    for s in $seconds; do
        HANGWATCH_TEST_OUTAGE_S="$s" .venv/bin/python -m pytest -n0 -s -q -p no:cacheprovider \
            "tests/e2e/test_outages.py::test_a_rank_that_exits_and_one_that_stalls_during_an_outage_reach_the_history" \
            | grep -E "^outage|passed|failed"
    done
done
