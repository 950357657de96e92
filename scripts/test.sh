#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
# System tools the tests run for real: promtool/prometheus, chromium, iptables, systemd-analyze, mpirun.
scripts/system-deps.sh || exit 1
.venv/bin/ruff check --quiet agent monitor hangwatch hangwatch_common tests benchmarks || exit 1
# Imports run only downward (pyproject.toml [tool.importlinter]).
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache || exit 1
.venv/bin/python -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    exit 1
fi
exit "$status"
