#!/usr/bin/env bash
# Idempotent set-up for a fresh clone: a virtual environment with torch (its CPU build, installed
# first so that nothing pulls a multi-GB CUDA build) and the project with what one use needs.
#
#   scripts/setup.sh          for the tests (scripts/test.sh): the demo and test extras
#   scripts/setup.sh demo     for the demo (scripts/demo.sh): the demo extra only (torch, numpy)
#
# HANGWATCH_VENV names the virtual environment (default .venv), PYTHON the interpreter that makes
# it (default python3). Each step says what it does on stderr; pip's own output goes to
# $VENV/setup.log and is shown only when a step fails. A venv already set up for this
# pyproject.toml (or for more: the test set-up covers the demo's) is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${HANGWATCH_VENV:-.venv}
TORCH_VERSION=2.13.0

case "${1:-test}" in
    demo) extras=demo; enough=(demo demo,test) ;;
    test) extras=demo,test; enough=(demo,test) ;;
    *) echo "setup: no set-up named '$1': demo or test (the default)" >&2; exit 2 ;;
esac

say() { echo "setup: $*" >&2; }
started=$SECONDS
step_started=$SECONDS
step() { step_started=$SECONDS; printf 'setup: %s... ' "$*" >&2; }
done_step() { echo "done ($((SECONDS - step_started)) s)" >&2; }

# What a finished set-up was made from: the project's requirements and the set-up itself.
stamp_of() { echo "$VENV/.hangwatch-setup-$1"; }
recipe=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
ready() {
    local extra
    for extra in "${enough[@]}"; do
        if [ "$(cat "$(stamp_of "$extra")" 2>/dev/null)" = "$recipe" ] &&
            "$VENV/bin/python" - "$PWD" <<'EOF' 2>/dev/null
import sys
import hangwatch, numpy, torch  # noqa: F401 - importable, and the project is this clone's
sys.exit(not hangwatch.__file__.startswith(sys.argv[1] + "/"))
EOF
        then
            return 0
        fi
    done
    return 1
}
if ready; then
    exit 0
fi

mkdir -p "$VENV"
LOG="$VENV/setup.log"
: >"$LOG"
pip() {
    if ! "$VENV/bin/python" -m pip --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
        echo "failed" >&2
        say "pip $1 failed; the end of $LOG:"
        tail -n 25 "$LOG" >&2
        exit 1
    fi
}
# Packages go in with uv where it can be had (from PyPI, into the venv): it unpacks and compiles
# in parallel, 21 s for a fresh test set-up here against pip's 59 s, and a second set-up on the
# same machine links from its cache. It is told where pip looks for local wheels (this machine's
# CPU torch lies in a find-links folder) and trusts the system's certificates, as pip is set up to.
# pip does it all where pip is given an index of its own (a mirror: uv reads no pip.conf and would
# go to PyPI), where uv cannot be had, and when uv fails.
# uv compiles no bytecode here (pip compiles all it installs): what the demo and the tests run is
# compiled at the end, by importing it once. A run imports a third of torch's ~3,000 modules, and
# compiling all of them and all of the extras took 19 of a fresh test set-up's 32 s here.
custom_index() {  # a mirror in the environment or in pip's configuration: uv would not know it
    [ -n "${PIP_INDEX_URL:-}" ] || "$@" -m pip config list 2>/dev/null | grep -q '^[a-z]*\.index-url='
}
uv_args=()
uv_ready=0
use_uv() {
    [ "$uv_ready" -eq 1 ] && return 0
    [ "$uv_ready" -eq 2 ] && return 1
    uv_ready=2
    if custom_index "$VENV/bin/python"; then
        return 1
    fi
    [ -x "$VENV/bin/uv" ] || "$VENV/bin/python" -m pip --disable-pip-version-check install --quiet uv >>"$LOG" 2>&1 ||
        return 1
    local loc
    for loc in $(printf '%s\n' ${PIP_FIND_LINKS:-} $("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null) |
        sort -u); do
        uv_args+=(--find-links "$loc")
    done
    uv_ready=1
}
install() {
    if [ "$uv_ready" -eq 1 ]; then
        if "$VENV/bin/uv" pip install --python "$VENV/bin/python" --native-tls \
            "${uv_args[@]}" "$@" >>"$LOG" 2>&1; then
            return 0
        fi
        printf '(uv failed, see %s; pip instead) ' "$LOG" >&2
        uv_ready=2
    fi
    pip install "$@"
}

if [ ! -x "$VENV/bin/python" ]; then
    step "creating a virtual environment in $VENV ($("$PYTHON" --version 2>&1))"
    # Without pip's own set-up in it (ensurepip: 5 of a fresh set-up's 23 s here) where the
    # interpreter's pip can put uv in the venv: uv then puts pip there in a moment. Else as usual.
    if custom_index "$PYTHON" || ! "$PYTHON" -m venv --without-pip "$VENV" >>"$LOG" 2>&1 ||
        ! "$PYTHON" -m pip --disable-pip-version-check --python "$VENV/bin/python" install --quiet uv >>"$LOG" 2>&1 ||
        ! "$VENV/bin/uv" pip install --python "$VENV/bin/python" --native-tls pip >>"$LOG" 2>&1; then
        "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1
    fi
    done_step
fi
# A venv left without pip (a set-up stopped above): pip runs the index checks and the fallback.
"$VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip --default-pip >>"$LOG" 2>&1

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # PyPI's torch for Linux is the CUDA build, with GBs of nvidia-* wheels: unless pip finds a
    # CPU build where it looks as set up here (a local wheel, a mirror), take PyTorch's CPU index.
    source=()
    if [ "$(uname -s)" = Linux ]; then
        chosen=$("$VENV/bin/python" -m pip --disable-pip-version-check install --dry-run --quiet --no-deps \
            --report - "torch==$TORCH_VERSION" 2>>"$LOG" | "$VENV/bin/python" -c '
import json, sys
try:
    print(json.load(sys.stdin)["install"][0]["metadata"]["version"])
except (ValueError, LookupError, TypeError):  # no report: pip found nothing, or is too old for --report
    pass' || true)
        case "$chosen" in
            "" | *+cpu) ;;  # nothing known (an older pip without --report), or a CPU build: as it is
            *) source=(--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple) ;;
        esac
    fi
    step "installing torch $TORCH_VERSION (CPU build: a 190 MB download, 750 MB installed)"
    if [ ${#source[@]} -eq 0 ] && use_uv; then
        install "torch==$TORCH_VERSION"
    else
        # PyTorch's own index: pip, whose index order is the one written (uv would prefer the
        # extra index, PyPI, and its CUDA build).
        pip install "${source[@]}" "torch==$TORCH_VERSION"
    fi
    done_step
fi
# From its metadata (2.13.0+cpu, as torch.__version__ says): importing torch before its bytecode is
# written takes ~4 s.
torch_installed=$("$VENV/bin/python" -c "from importlib.metadata import version; print(version('torch'))" 2>/dev/null)

case "$extras" in
    demo) step "installing hangwatch with its demo extra (numpy beside torch)" ;;
    *) step "installing hangwatch with its demo and test extras (pytest, playwright, lightning, schemathesis...)" ;;
esac
# The torch installed stays: nothing in the extras (lightning, torchmetrics) may swap it for
# another build.
use_uv || true
install -e ".[$extras]" "torch==$torch_installed"
done_step

# Bytecode for what runs, written once now: a demo or suite run started with PYTHONDONTWRITEBYTECODE
# set would otherwise compile torch (~2 s) in every rank, and the suite's first ranks would all
# compile it at once. Torch and the project's daemons side by side, on two cores.
step "compiling what the demo and the daemons import"
warm() { env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c "$1" >>"$LOG" 2>&1; }
warm "import torch, torch.distributed.run" &
torch_warm=$!
if ! warm "import agent.cli, hangwatch.cli, monitor.relay.cli, monitor.web.cli" || ! wait "$torch_warm"; then
    echo "failed" >&2
    say "importing what was installed failed; the end of $LOG:"
    tail -n 25 "$LOG" >&2
    exit 1
fi
done_step

echo "$recipe" >"$(stamp_of "$extras")"
say "ready: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1), torch $torch_installed) in $((SECONDS - started)) s"
