"""agent/workload_names.py: a pod's uid from /proc/PID/cgroup text, under both cgroup drivers."""

from __future__ import annotations

import os
import pathlib

import pytest

from agent.workload_names import pod_uid, read_pod_uid

UID = "0b5c1f6e-1a2b-4c3d-8e9f-001122334455"


@pytest.mark.parametrize(("text", "uid"), [
    # cgroup v2, systemd driver: dashes written as underscores.
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5c1f6e_1a2b_4c3d_8e9f_001122334455.slice/"
     "cri-containerd-8f3e.scope\n", UID),
    ("0::/kubepods.slice/kubepods-pod0b5c1f6e_1a2b_4c3d_8e9f_001122334455.slice/cri-containerd-1.scope\n", UID),
    # cgroupfs driver, and cgroup v1's many lines.
    ("0::/kubepods/besteffort/pod0b5c1f6e-1a2b-4c3d-8e9f-001122334455/4f9a\n", UID),
    ("12:memory:/kubepods/burstable/pod0b5c1f6e-1a2b-4c3d-8e9f-001122334455/4f9a\n"
     "11:cpu,cpuacct:/kubepods/burstable/pod0b5c1f6e-1a2b-4c3d-8e9f-001122334455/4f9a\n", UID),
    # Not a pod: a systemd service, a docker container, a Slurm job step.
    ("0::/system.slice/hangwatch-agent.service\n", None),
    ("0::/system.slice/docker-4f9a.scope\n", None),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", None),
    ("", None),
])
def test_pod_uid(text: str, uid: str | None) -> None:
    assert pod_uid(text) == uid


def test_read_pod_uid_from_a_proc_tree(tmp_path) -> None:
    (tmp_path / "123").mkdir()
    (tmp_path / "123" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/4f9a\n")
    assert read_pod_uid(str(tmp_path), 123) == UID
    assert read_pod_uid(str(tmp_path), 124) is None  # a vanished process is no error
    # The real /proc reads without error, whatever this machine is.
    own = pathlib.Path(f"/proc/{os.getpid()}/cgroup").read_text()
    assert read_pod_uid("/proc", os.getpid()) == pod_uid(own)
