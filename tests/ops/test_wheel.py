"""The wheel nodes install (docs/install.md): `pip wheel --no-deps` on a copy of the sources gives one
wheel holding the four packages, the status page's static files, the runbook and the four console scripts;
installed into a fresh venv, its hangwatch-agent, hangwatch-monitor, hangwatch-relay and hangwatch answer --version.

Offline and fast: the wheel is built without build isolation (this environment's setuptools) and
installed with --no-deps by this environment's pip (``pip --python``: into the fresh venv, run by
its interpreter), so the venv needs no pip of its own (ensurepip's copy took 6 of the test's 14 s);
the runtime dependencies come from this environment's site-packages through a path line in the
fresh venv. A path line, unlike `--system-site-packages` or site.addsitedir, does not run that
directory's .pth files, so the editable install of this checkout stays out and the code that runs
is the wheel's (checked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

from tests.ops.conftest import project_version

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"hangwatch-agent": "agent.cli:main", "hangwatch-monitor": "monitor.web.cli:main",
           "hangwatch-relay": "monitor.relay.cli:main", "hangwatch": "hangwatch.cli:main"}
STATIC = ("monitor/web/static/index.html", "monitor/web/static/app.js", "monitor/web/static/style.css",
          "monitor/web/static/runbook.css")
# The runbook the monitor serves as /runbook (monitor/web/runbook.py): docs/runbook.md's copy in the package.
RUNBOOK = "monitor/web/runbook.md"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_wheel_installs_and_runs_from_a_fresh_venv(tmp_path: Path) -> None:
    # A copy of what the wheel is made of (as the Docker context is), so that setuptools' build/ and
    # egg-info never land in the checkout other tests are reading.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("agent", "monitor", "hangwatch", "hangwatch_common"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(dist), str(src)])
    wheels = list(dist.glob("*.whl"))
    version = project_version()
    assert [w.name for w in wheels] == [f"hangwatch-{version}-py3-none-any.whl"]

    with zipfile.ZipFile(wheels[0]) as whl:
        names = set(whl.namelist())
        for path in STATIC:
            assert path in names, f"{path} is not in the wheel: the page would 404"
        assert {"agent/cli.py", "monitor/web/cli.py", "hangwatch/cli.py"} <= names
        assert RUNBOOK in names, "the runbook is not in the wheel: /runbook and every alert's link would fail"
        assert whl.read(RUNBOOK) == (ROOT / "docs" / "runbook.md").read_bytes(), "stale copy: run scripts/build-mixin.py"
        assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
        # The simulated nodes (network namespaces, run as root) are test machinery: tests/netns.py.
        assert not [n for n in names if n.rsplit("/", 1)[-1] == "netns.py"], "netns.py is in the wheel"
        info = f"hangwatch-{version}.dist-info"
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
        metadata = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
    for script, target in SCRIPTS.items():
        assert f"{script} = {target}" in entry_points
    # torch only under an extra: a node's `pip install hangwatch` never pulls it.
    torch_reqs = [r for r in metadata.get_all("Requires-Dist") or [] if r.startswith("torch")]
    assert torch_reqs and all("extra ==" in r for r in torch_reqs), torch_reqs

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
         "--disable-pip-version-check", "-q", str(wheels[0])])
    fresh_site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (fresh_site / "zz_runtime_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HANGWATCH_", "PYTHON"))}
    for script in SCRIPTS:
        out = run([str(venv / "bin" / script), "--version"], env=env, cwd=tmp_path).stdout
        assert out.startswith(f"{script} {version} "), out
    where = run([str(python), "-c", "import agent, monitor, hangwatch; print(agent.__file__, monitor.__file__, "
                 "hangwatch.__file__)"], env=env, cwd=tmp_path).stdout.split()
    assert all(Path(p).is_relative_to(fresh_site) for p in where), f"not the wheel's code: {where}"
    # The page's files and the runbook are where the installed monitor serves them from.
    assert all((fresh_site / path).is_file() for path in (*STATIC, RUNBOOK))
