#!/usr/bin/env bash
# Idempotent: install the system tools the ops tests run for real (promtool and a Prometheus
# server, headless Chromium, iptables, systemd-analyze, Open MPI's mpirun) and the Python
# packages they drive them with. Installs only what is missing; runs `apt-get update` at most
# once, and only then.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HANGWATCH_VENV:-.venv}

# command -> Debian package that provides it
declare -A PROVIDES=(
    [prometheus]=prometheus
    [promtool]=prometheus
    [chromium]=chromium
    [iptables]=iptables
    [systemd-analyze]=systemd
    [ip]=iproute2
    [tc]=iproute2
    [mpirun]=openmpi-bin
    # The container image's build and smoke test (tests/ops/test_container.py): podman, runc (crun,
    # podman's default runtime, refuses hybrid cgroups) and debootstrap (the stand-in base image).
    [podman]=podman
    [runc]=runc
    [debootstrap]=debootstrap
    # The Alertmanager inhibit example (deploy/prometheus/alertmanager-inhibit.yml):
    # `amtool check-config` and a real Alertmanager in tests/ops/test_alert_rules.py.
    [amtool]=prometheus-alertmanager
    [prometheus-alertmanager]=prometheus-alertmanager
)

missing=()
for cmd in "${!PROVIDES[@]}"; do
    if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/bin/$cmd" ] && [ ! -x "/usr/sbin/$cmd" ]; then
        pkg=${PROVIDES[$cmd]}
        [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    echo "system-deps: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Python side: PyYAML (manifests, rule files) and playwright (drives /usr/bin/chromium; its
# wheel carries the driver, so no `playwright install` download is needed).
if [ -x "$VENV/bin/python" ]; then
    if ! "$VENV/bin/python" -c "import yaml, playwright" 2>/dev/null; then
        "$VENV/bin/python" -m pip --disable-pip-version-check -q install "pyyaml>=6" "playwright>=1.40"
    fi
else
    echo "system-deps: no virtual environment at $VENV (run scripts/setup.sh first) - skipped pip" >&2
fi
