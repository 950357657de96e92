# hangwatch: one image, every daemon (docs/install.md). Built from the repository's root with
#   podman build --format docker -t hangwatch:0.1.0 .      (or: docker build -t hangwatch:0.1.0 .)
# which is the image the Helm chart (deploy/helm/hangwatch) and deploy/kubernetes/ run by default.
#   monitor (the default command, uid 10001):
#     docker run -d -p 8787:8787 -v hangwatch-state:/var/lib/hangwatch IMAGE
#   agent (one per node; root, host PID namespace, ptrace for py-spy; the HEALTHCHECK is the monitor's):
#     docker run -d --pid=host --cap-add SYS_PTRACE --security-opt apparmor=unconfined --user 0 --no-healthcheck IMAGE \
#         hangwatch-agent --monitor http://MONITOR:8787 --node "$(hostname)" --dump-other-users
# No torch: the agent and the monitor never import it (it is the demo and test extra only).

# The base is a build argument so that a mirror, a digest pin (python:3.11-slim-bookworm@sha256:...)
# or, in this repo's CI, a locally made stand-in can replace it (tests/ops/test_container.py).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Only what the wheel is made of (.dockerignore keeps the rest of the tree out of the context).
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY monitor ./monitor
COPY hangwatch ./hangwatch
COPY hangwatch_common ./hangwatch_common
# One wheel, then a venv holding it and its runtime dependencies (binary wheels only: no
# compiler in this stage, and a dependency without a wheel fails here, not at run time).
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/hangwatch \
 && /opt/hangwatch/bin/python -m pip install --no-cache-dir --only-binary=:all: /wheels/hangwatch-*.whl \
 && ! /opt/hangwatch/bin/python -c "import torch" 2>/dev/null

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="hangwatch" \
      org.opencontainers.image.description="Live hang detection for distributed PyTorch training: hangwatch-monitor (default) and hangwatch-agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/install.md"

# A fixed uid/gid, the one the Helm chart's monitor and relays run as (and own the volume with).
# (--no-log-init: a high uid would otherwise make useradd write a sparse multi-GB lastlog.)
RUN groupadd --gid 10001 hangwatch \
 && useradd --no-log-init --uid 10001 --gid 10001 --home-dir /var/lib/hangwatch --no-create-home \
        --shell /usr/sbin/nologin hangwatch \
 && mkdir -p /var/lib/hangwatch \
 && chown 10001:10001 /var/lib/hangwatch \
 && chmod 0750 /var/lib/hangwatch

# The venv's path is the same in both stages, so its scripts' #! lines stay valid.
COPY --from=build /opt/hangwatch /opt/hangwatch

# The monitor listens on every interface inside the container (its own default is loopback only)
# and keeps its SQLite database in the volume.
ENV PATH=/opt/hangwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HANGWATCH_HOST=0.0.0.0 \
    HANGWATCH_PORT=8787 \
    HANGWATCH_STATE_DIR=/var/lib/hangwatch

VOLUME ["/var/lib/hangwatch"]
EXPOSE 8787
USER 10001:10001

# /healthz, not /metrics or /diagnose: it answers without a token when the monitor's read and
# metrics tokens are set. Plain http on HANGWATCH_PORT (with HTTPS configured, probe from outside).
# Kubernetes ignores HEALTHCHECK and uses the manifest's probes of the same path.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HANGWATCH_PORT', '8787'), timeout=4)"]

# The command chooses the daemon: hangwatch-monitor by default; `IMAGE hangwatch-agent ...`
# or `IMAGE hangwatch status ...` for the others. Any arguments after the image replace it.
CMD ["hangwatch-monitor"]
