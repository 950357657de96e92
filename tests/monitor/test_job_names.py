"""monitor/engine/job_names.py: the names people know a job by, table-style."""

from __future__ import annotations

import pytest

from monitor.engine.job_names import PODS_LISTED, job_names, rank_names

POD = {"POD_UID": "0b5c1f6e-1a2b-4c3d-8e9f-001122334455", "HOSTNAME": "trainer-worker-0"}


@pytest.mark.parametrize(("env", "names"), [
    ({}, {}),
    ({"SLURM_JOB_ID": "4242"}, {"slurm_job": "4242"}),
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "llama"},
     {"slurm_job": "4242.0", "slurm_job_name": "llama"}),
    # An array task as squeue shows it, not its own job id.
    ({"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "7", "SLURM_STEP_ID": "1"},
     {"slurm_job": "4242_7.1"}),
    # HOSTNAME is a pod's name only inside a pod.
    ({"HOSTNAME": "node17"}, {}),
    (POD, {"k8s_pod": "trainer-worker-0"}),
    ({**POD, "POD_NAME": "trainer-worker-0x", "POD_NAMESPACE": "ml"}, {"k8s_pod": "trainer-worker-0x", "k8s_namespace": "ml"}),
    ({"POD_NAMESPACE": "ml"}, {"k8s_namespace": "ml"}),
    ({"TORCHELASTIC_RUN_ID": "none"}, {}),
    ({"TORCHELASTIC_RUN_ID": "run-7"}, {"torchelastic_run_id": "run-7"}),
])
def test_rank_names(env: dict, names: dict) -> None:
    assert rank_names(env) == names


def _pod(name: str, namespace: str = "ml") -> dict:
    return {"POD_NAME": name, "POD_NAMESPACE": namespace}


@pytest.mark.parametrize(("job_id", "envs", "names"), [
    ("10.0.0.1:29500", [{}, {}], {}),
    ("10.0.0.1:29500", [{"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "bert"}] * 2,
     {"slurm_job": "9.0", "slurm_job_name": "bert", "display": "slurm job 9.0 (bert)"}),
    ("10.0.0.1:29500", [_pod("w-1"), _pod("w-0")],
     {"k8s_namespace": "ml", "k8s_pods": ["w-0", "w-1"], "display": "pod ml/w-0 (+1 more)"}),
    ("10.0.0.1:29500", [_pod("w-0")] * 3, {"k8s_namespace": "ml", "k8s_pods": ["w-0"], "display": "pod ml/w-0"}),
    # The run id is the job id already: said once.
    ("run-7", [{"TORCHELASTIC_RUN_ID": "run-7"}], {}),
    ("10.0.0.1:29500", [{"TORCHELASTIC_RUN_ID": "run-7"}],
     {"torchelastic_run_id": "run-7", "display": "torchelastic run run-7"}),
    # Slurm first: a pod under Slurm is rare, a Slurm id is what the user typed.
    ("x:1", [{"SLURM_JOB_ID": "9", **_pod("w-0")}],
     {"slurm_job": "9", "k8s_namespace": "ml", "k8s_pods": ["w-0"], "display": "slurm job 9"}),
])
def test_job_names(job_id: str, envs: list, names: dict) -> None:
    assert job_names(job_id, envs) == names


def test_a_big_job_lists_some_pods_and_counts_the_rest() -> None:
    envs = [_pod(f"w-{i:03d}") for i in range(PODS_LISTED + 5)]
    names = job_names("x:1", envs)
    assert len(names["k8s_pods"]) == PODS_LISTED and names["k8s_pods_more"] == 5
    assert names["display"] == f"pod ml/w-000 (+{PODS_LISTED + 4} more)"
