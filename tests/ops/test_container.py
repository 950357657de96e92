"""The image, built and run with podman (Debian's 4.3, rootful): the Dockerfile as shipped, its
monitor container serving /metrics as uid 10001 with its database in the volume and a passing
HEALTHCHECK, and its agent container run the documented way (host PID namespace, SYS_PTRACE, root)
dumping the stack of a Python "rank" on the host and reporting it to the monitor container.

No registry but PyPI and Debian is reachable here, so python:3.11-slim-bookworm cannot be pulled:
the build is given a stand-in base (Dockerfile's PYTHON_IMAGE argument) that debootstrap makes from
deb.debian.org: Debian's python3.11 with venv and pip, `python` on PATH, as the official image has,
plus this host's CA bundle, because PyPI is reached through a TLS-inspecting proxy here (without it
pip fails: "CERTIFICATE_VERIFY_FAILED ... self-signed certificate in certificate chain"). It is made
once per CA bundle and kept in podman's storage.

What this machine needs, and why (each found by the error it gives otherwise):
- builds use `--isolation chroot`: the default OCI isolation runs crun, which refuses this host's
  hybrid cgroup v1/v2 layout ("cgroups in hybrid mode not supported, drop all controllers from
  cgroupv2"), with or without `--cgroups=disabled`;
- containers run with runc (`--runtime runc`), which handles hybrid cgroups;
- explicit `--ulimit nofile/nproc`: podman's defaults (nofile 1048576) are above this VM's hard
  limits and the runtime's setrlimit fails ("error setting rlimit type 7: operation not permitted");
- no systemd here, so podman cannot schedule health checks (it logs "unable to get systemd
  connection"): the monitor's HEALTHCHECK is run by hand (`podman healthcheck run`).

The built image is kept in podman's storage between runs, under a tag that names everything it is
made of (``image_key``): the build context (the files .dockerignore lets in), the Dockerfile, the
base, podman's version, and the day, since the build takes the newest runtime dependencies PyPI
has (pyproject.toml pins none) and should meet a new release within a day. A run whose key is
there uses that image; any change to them builds it again, from scratch (``--layers=false``).

Measured here (2 idle cores): the stand-in base ~55 s (once per machine), the build ~28 s (~29 s of
CPU: pip downloads and installs the runtime wheels from PyPI each time), the containers ~15 s;
with the image kept, the set-up is under a second.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from hangwatch.demo.harness import LOOPBACK, MonitorClient, free_port
from tests.ops.conftest import project_version

ROOT = Path(__file__).resolve().parents[2]
PODMAN = "/usr/bin/podman"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Per run: a concurrent run (another checkout on this machine) must not remove the image in use here.
IMAGE = f"localhost/hangwatch:test-{uuid.uuid4().hex[:8]}"
# Built images kept between runs, tagged DAY-KEY (image_key); the newest few of the day are kept.
IMAGE_CACHE = "localhost/hangwatch-test-cache"
IMAGES_KEPT = 3
UID = 10001
STARTUP_TIMEOUT = 60.0
# runc, and rlimits under this VM's hard limits (see above); every container is run with these.
RUN = [PODMAN, "--runtime", "runc", "run", "--ulimit", "nofile=8192:8192", "--ulimit", "nproc=4096:4096"]
# The documented agent flags (docs/install.md); --no-healthcheck: the image's HEALTHCHECK probes
# the monitor's port, which an agent container does not serve.
AGENT_FLAGS = ["--pid=host", "--cap-add", "SYS_PTRACE", "--user", "0", "--no-healthcheck"]
# On a fresh machine the first test's set-up makes the stand-in base (debootstrap, its own 600-s
# limit) and then builds the image: past the suite's 300-s default under a loaded CI run (seen). Each
# podman call has its own limit; this only keeps pytest-timeout from cutting a slow first build short.
pytestmark = pytest.mark.timeout(900)

T = TypeVar("T")


def podman(*args: str, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, context: Callable[[], str] = str) -> T:
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"no {what} within {timeout:.0f}s\n{context()}")
        time.sleep(0.25)


def make_base() -> str:
    """The stand-in for python:3.11-slim-bookworm (see the module docstring); its tag names the CA
    bundle it carries, so a changed bundle makes a new one."""
    digest = hashlib.sha256(CA_BUNDLE.read_bytes()).hexdigest()[:12]
    tag = f"localhost/hangwatch-ci-base:bookworm-{digest}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    for tool in ("debootstrap", "runc"):
        assert shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists(), f"{tool} missing: run scripts/system-deps.sh"
    with tempfile.TemporaryDirectory(prefix="hangwatch-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        boot = subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,python3-pip,python-is-python3,"
             "ca-certificates", "bookworm", str(rootfs), "http://deb.debian.org/debian"],
            capture_output=True, text=True, timeout=600)
        assert boot.returncode == 0, f"debootstrap failed:\n{boot.stdout[-2000:]}\n{boot.stderr[-2000:]}"
        shutil.copyfile(CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            # The official image's environment: PATH, LANG; PIP_CERT for Debian's pip to use the bundle.
            podman("import", "--quiet",
                   "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "--change", "ENV LANG=C.UTF-8",
                   "--change", f"ENV PIP_CERT={CA_BUNDLE}",
                   "--change", 'CMD ["python3"]', "-", tag, stdin=tar.stdout, timeout=300)
        finally:
            tar.stdout.close()
            tar.wait(timeout=60)
    return tag


def context_files() -> list[Path]:
    """What ``podman build`` sends of the repository: the paths .dockerignore lets in (``!path``
    after ``*``), less the patterns it leaves out; a file too many only costs a rebuild."""
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", f".dockerignore is no longer an allow-list: teach context_files its form\n{rules}"
    allowed = [ROOT / rule[1:].rstrip("/") for rule in rules[1:] if rule.startswith("!")]
    left_out = [rule.removeprefix("**/") for rule in rules[1:] if not rule.startswith("!")]
    found = []
    for top in allowed:
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            parts = path.relative_to(ROOT).parts
            if path.is_file() and not any(fnmatch.fnmatch(part, rule) for part in parts for rule in left_out):
                found.append(path)
    return found


def image_key(base: str) -> str:
    """DAY-DIGEST: the day (UTC) and a digest of all the build reads (see the module docstring)."""
    digest = hashlib.sha256()
    base_id = podman("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    for fact in (podman("--version").stdout.strip(), base_id, f"PYTHON_IMAGE={base}"):
        digest.update(fact.encode() + b"\0")
    for path in [ROOT / "Dockerfile", ROOT / ".dockerignore", *context_files()]:
        digest.update(f"{path.relative_to(ROOT)}\0{path.stat().st_mode & 0o777:o}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return f"{time.strftime('%Y%m%d', time.gmtime())}-{digest.hexdigest()[:16]}"


def forget_old_images(keep: str) -> None:
    """Untag the kept images of other days, and all but the newest few of today. An image a
    concurrent run is using stays under that run's own tag until it ends."""
    listed = json.loads(podman("image", "ls", "--format", "json", "--filter", f"reference={IMAGE_CACHE}").stdout or "[]")
    tags = sorted(((image["Created"], name) for image in listed for name in image.get("Names") or []
                   if name.startswith(IMAGE_CACHE + ":") and name != keep), reverse=True)
    today = keep.rsplit(":", 1)[1].split("-", 1)[0]
    for rank, (_, name) in enumerate(tags, start=2):  # `keep` itself is the first
        if rank > IMAGES_KEPT or not name.rsplit(":", 1)[1].startswith(today):
            podman("rmi", name, check=False, timeout=120)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs rootful podman (run as root, as CI does)")
    assert Path(PODMAN).exists(), "podman missing: run scripts/system-deps.sh"
    base = make_base()
    kept = f"{IMAGE_CACHE}:{image_key(base)}"
    # The kept image under this run's own tag; a concurrent run may untag it first: then build.
    if podman("tag", kept, IMAGE, check=False).returncode == 0:
        print(f"image kept from an earlier run: {kept}", file=sys.stderr)
    else:
        started = time.monotonic()
        # --network host: the build's pip reaches PyPI as this host does. --format docker: the OCI
        # format has no HEALTHCHECK (podman would drop it with a warning). --layers=false: no cached
        # intermediate images: the build starts from the base, and leaves only the image it made.
        podman("build", "--isolation", "chroot", "--format", "docker", "--network", "host", "--layers=false",
               "--build-arg", f"PYTHON_IMAGE={base}", "--tag", IMAGE, str(ROOT), timeout=600)
        print(f"image built in {time.monotonic() - started:.1f}s", file=sys.stderr)
        podman("tag", IMAGE, kept)
        forget_old_images(kept)
    try:
        yield IMAGE
    finally:
        # Only this run's tag: the image stays under the kept one.
        podman("rmi", "--force", IMAGE, check=False, timeout=120)


@pytest.fixture
def names() -> Iterator[Callable[[str], str]]:
    """Unique container and volume names (other runs may share this podman), removed afterwards."""
    made: list[str] = []
    suffix = uuid.uuid4().hex[:8]

    def name(kind: str) -> str:
        made.append(f"hangwatch-test-{kind}-{suffix}")
        return made[-1]

    yield name
    for n in made:
        # --volumes: also the anonymous volume the image's VOLUME gave a container without -v.
        podman("rm", "--force", "--volumes", "--time", "2", n, check=False, timeout=60)
        podman("volume", "rm", "--force", n, check=False, timeout=60)


def test_image_config(image: str) -> None:
    inspect = json.loads(podman("image", "inspect", image).stdout)[0]
    config = inspect["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Cmd"] == ["hangwatch-monitor"] and not config.get("Entrypoint")
    assert "8787/tcp" in config["ExposedPorts"]
    assert "/var/lib/hangwatch" in config["Volumes"]
    assert "/healthz" in " ".join(inspect["Healthcheck"]["Test"])
    assert config["Labels"]["org.opencontainers.image.version"] == project_version()


def test_commands_in_the_image(image: str) -> None:
    version = project_version()
    for command in ("hangwatch-agent", "hangwatch-monitor", "hangwatch"):
        out = podman(*RUN[1:], "--rm", "--network", "none", "--no-healthcheck", image, command, "--version").stdout
        assert out.startswith(f"{command} {version} "), out
    # py-spy (the agent's stack sampler) is in the image; torch is not.
    out = podman(*RUN[1:], "--rm", "--network", "none", "--no-healthcheck", image, "py-spy", "--version").stdout
    assert out.startswith("py-spy "), out
    torch = podman(*RUN[1:], "--rm", "--network", "none", "--no-healthcheck", image, "python", "-c", "import torch",
                   check=False)
    assert torch.returncode != 0 and "No module named 'torch'" in torch.stderr, torch.stderr


def test_monitor_and_agent_containers(image: str, names: Callable[[str], str], tmp_path: Path) -> None:
    monitor, volume, agent = names("monitor"), names("state"), names("agent")
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    # The default command, as docs/install.md runs it (published on loopback only, for the test),
    # and locked down as monitor-deployment.yaml runs it: read-only root, no capabilities.
    podman(*RUN[1:], "--detach", "--name", monitor, "--publish", f"{LOOPBACK}:{port}:8787",
           "--volume", f"{volume}:/var/lib/hangwatch", "--read-only", "--cap-drop", "ALL", image)

    def monitor_log() -> str:
        return "monitor log:\n" + podman("logs", monitor, check=False).stderr[-3000:]

    def metrics() -> str | None:
        try:
            r = httpx.get(url + "/metrics", timeout=2.0)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    text = wait_for("/metrics from the monitor container", metrics, STARTUP_TIMEOUT, monitor_log)
    assert f'hangwatch_build_info{{version="{project_version()}"' in text
    # The daemon itself (pid 1 in the container) runs as the image's user, and its database is in
    # the volume, owned by that user.
    status = podman("exec", monitor, "cat", "/proc/1/status").stdout
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert uids == [str(UID)] * 4, status
    owner = podman("exec", monitor, "stat", "-c", "%u %n", "/var/lib/hangwatch/monitor.db").stdout.split()
    assert owner == [str(UID), "/var/lib/hangwatch/monitor.db"]
    health = podman("healthcheck", "run", monitor, check=False)
    assert health.returncode == 0 and "healthy" in podman("inspect", "--format", "{{.State.Health.Status}}",
                                                          monitor).stdout, health.stderr

    # A "rank" on the host, outside any container: a Python process with torchrun's variables,
    # parked in a function whose name the agent's py-spy dump must show.
    master_port = free_port()
    job_id = f"{LOOPBACK}:{master_port}"
    rank_env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": LOOPBACK,
                "MASTER_PORT": str(master_port)}
    rank = subprocess.Popen([sys.executable, "-c", "import time\ndef parked_in_container_test():\n"
                             "    time.sleep(300)\nparked_in_container_test()\n"], env=rank_env)
    client = MonitorClient(url)
    try:
        # The agent container as documented: host PID namespace, SYS_PTRACE, root; host network
        # here only so that it reaches the monitor's published loopback port.
        # Read-only root, as agent-daemonset.yaml runs it.
        podman(*RUN[1:], "--detach", "--name", agent, *AGENT_FLAGS, "--read-only", "--network", "host", image,
               "hangwatch-agent", f"--monitor={url}", "--interval=0.5", f"--job={job_id}", "--node=container-test")

        def agent_log() -> str:
            return "agent log:\n" + podman("logs", agent, check=False).stderr[-3000:] + "\n" + monitor_log()

        def rank_with_stack() -> dict | None:
            try:
                job = client.job(job_id)
            except httpx.HTTPError:
                return None
            return job if job and "parked_in_container_test" in json.dumps(job) else None

        job = wait_for(f"stack of pid {rank.pid} in the monitor's view of {job_id}", rank_with_stack,
                       STARTUP_TIMEOUT, agent_log)
        assert "container-test" in json.dumps(job)

        # Without SYS_PTRACE (root and the host's PIDs are not enough) the agent does not even
        # see the rank: /proc/PID/environ, where RANK is read, needs ptrace-read access.
        flags = [f for f in AGENT_FLAGS if f not in ("--cap-add", "SYS_PTRACE")]
        once = podman(*RUN[1:], "--rm", *flags, "--network", "none", image, "hangwatch-agent", "--once",
                      "--interval=0.2", f"--job={job_id}")
        assert json.loads(once.stdout)["ranks"] == [], once.stdout[-2000:]
    finally:
        client.close()
        rank.kill()
        rank.wait(timeout=10)
