#!/usr/bin/env bash
# Set up (if needed) and run the demo: a real 2-rank gloo job that goes wrong,
# diagnosed live by a real agent and monitor.
# Usage: scripts/demo.sh [deadlock|straggler|exit|slow|stopped] [--linger [SECONDS]]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
case=deadlock
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first word that is not an option names the case
    case="$1"
    shift
fi
exec .venv/bin/hangwatch demo "$case" "$@"
