#!/usr/bin/env bash
# Idempotent set-up for a fresh clone: a virtual environment with torch (CPU build,
# installed first so nothing pulls a multi-GB CUDA build) and the project.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${HANGWATCH_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    pip install "torch==2.13.0"
fi
# The torch installed stays: nothing in the test extra (lightning, torchmetrics) may swap it
# for another build.
pip install -e ".[test]" "torch==$("$VENV/bin/python" -c "import torch; print(torch.__version__)")"
