"""The names people know a job by (Slurm job, Kubernetes pod), shown for a real hung job found by
the real agent: from the ranks' environment, as a pod's downward API or Slurm sets it."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import STALL_STEP

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

LINGER = ("--fail", "linger", "--fail-at-step", str(STALL_STEP))
POD_UID = "0b5c1f6e-1a2b-4c3d-8e9f-001122334455"


def test_a_job_in_a_pod_is_known_by_its_namespace_and_pod(torchrun_job, wait_for_verdict, client):
    pod = {"POD_NAME": "trainer-worker-0", "POD_NAMESPACE": "ml-team", "POD_UID": POD_UID}
    job = torchrun_job(*LINGER, env=pod)
    got = wait_for_verdict(job, "deadlock", culprits=[1])
    assert got["names"]["k8s_namespace"] == "ml-team"
    assert got["names"]["k8s_pods"] == ["trainer-worker-0"]
    assert got["names"]["display"] == "pod ml-team/trainer-worker-0"
    assert {r["k8s_pod"] for r in got["ranks"]} == {"trainer-worker-0"}
    assert "known as pod ml-team/trainer-worker-0" in client.diagnose_text(job.job_id)


def test_a_job_outside_pods_and_slurm_has_no_other_name(torchrun_job, wait_for_verdict):
    job = torchrun_job(*LINGER)
    got = wait_for_verdict(job, "deadlock", culprits=[1])
    assert "display" not in got["names"] and "k8s_pods" not in got["names"]
    assert {r["k8s_pod"] for r in got["ranks"]} == {None}  # HOSTNAME alone names no pod
