"""What the scheduler calls a rank's workload: its Kubernetes pod, found from its cgroup path.

People think in Slurm job ids and Kubernetes pods, not in ``MASTER_ADDR:PORT``. Slurm's ids
and a pod's downward-API variables are in the environment (discovery's allowlist sends them).
A pod without the downward API still shows itself in the cgroup path the kubelet gives it,
under both cgroup drivers:

- systemd: ``0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``
  (the uid's dashes written as underscores);
- cgroupfs: ``0::/kubepods/burstable/pod<uid>/<container id>``.

The pod's uid is sent as ``POD_UID`` (what the downward API's ``metadata.uid`` is usually
exported as), so the monitor knows the rank runs in a pod, whose name is then its HOSTNAME.
"""

from __future__ import annotations

import re

POD_IN_CGROUP = re.compile(r"kubepods[^\n]*?[/-]pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid(cgroup_text: str) -> str | None:
    """The pod uid in /proc/PID/cgroup text, dashed as Kubernetes writes it; None outside a pod."""
    match = POD_IN_CGROUP.search(cgroup_text)
    return match.group(1).replace("_", "-") if match else None


def read_pod_uid(proc_root: str, pid: int) -> str | None:
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            return pod_uid(f.read(8192))
    except (OSError, UnicodeDecodeError):
        return None
