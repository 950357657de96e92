#!/usr/bin/env bash
# Set up (if needed: the demo's needs only, scripts/setup.sh demo) and run the demo: a real
# 2-rank gloo job that goes wrong, diagnosed live by a real agent and monitor.
# Usage: scripts/demo.sh [deadlock|straggler|exit|slow|stopped] [--linger [SECONDS]] [--port PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HANGWATCH_VENV:-.venv}
scripts/setup.sh demo
case=deadlock
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first word that is not an option names the case
    case="$1"
    shift
fi
exec "$VENV/bin/hangwatch" demo "$case" "$@"
