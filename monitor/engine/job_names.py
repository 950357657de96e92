"""What people call a job, beside hangwatch's job id: its Slurm job, its Kubernetes pods, its
torchelastic run. Pure, from the ranks' reported environment (agent/discovery.py's allowlist).

The job id stays the key (``MASTER_ADDR:PORT`` is what every rank of a job shares, on every
launcher); these names are how the person on call finds the job in ``squeue`` or ``kubectl``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

# Pods named in a job's names; a 1,000-pod job lists the first ones and counts the rest.
PODS_LISTED = 8


def rank_names(env: Mapping[str, str]) -> dict[str, str]:
    """One rank's names from its environment: only the keys that apply."""
    out: dict[str, str] = {}
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"  # as squeue shows an array task
    if job:
        step = env.get("SLURM_STEP_ID")
        out["slurm_job"] = f"{job}.{step}" if step else job
        if env.get("SLURM_JOB_NAME"):
            out["slurm_job_name"] = env["SLURM_JOB_NAME"]
    # HOSTNAME names the pod only inside one: any other process has the node's name there.
    in_pod = any(env.get(k) for k in ("POD_UID", "POD_NAME", "POD_NAMESPACE"))
    if in_pod:
        pod = env.get("POD_NAME") or env.get("HOSTNAME")
        if pod:
            out["k8s_pod"] = pod
        if env.get("POD_NAMESPACE"):
            out["k8s_namespace"] = env["POD_NAMESPACE"]
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        out["torchelastic_run_id"] = run_id
    return out


@lru_cache(maxsize=1 << 14)
def env_names(env: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """``rank_names`` of an environment given as the rank view's sorted pairs, memoised: the ranks
    of a job mostly share one environment (all of it, or all but the pod), and a 10,000-rank job's
    answer asks for every rank's. The dict returned is shared: read it, never change it."""
    return rank_names(dict(env))


def job_names(job_id: str, rank_envs: Iterable[Mapping[str, str] | tuple[tuple[str, str], ...]]) -> dict[str, Any]:
    """The job's names over its ranks, and ``display``: the one a person would say first."""
    slurm: dict[str, str] = {}
    namespaces: set[str] = set()
    pods: set[str] = set()
    run_ids: set[str] = set()
    for env in rank_envs:
        names = env_names(env) if isinstance(env, tuple) else rank_names(env)
        if "slurm_job" in names and "slurm_job" not in slurm:
            slurm = {k: v for k, v in names.items() if k.startswith("slurm_")}
        if "k8s_namespace" in names:
            namespaces.add(names["k8s_namespace"])
        if "k8s_pod" in names:
            pods.add(names["k8s_pod"])
        if "torchelastic_run_id" in names:
            run_ids.add(names["torchelastic_run_id"])
    out: dict[str, Any] = dict(slurm)
    if namespaces:
        out["k8s_namespace"] = ", ".join(sorted(namespaces))
    if pods:
        listed = sorted(pods)
        out["k8s_pods"] = listed[:PODS_LISTED]
        if len(listed) > PODS_LISTED:
            out["k8s_pods_more"] = len(listed) - PODS_LISTED
    if len(run_ids) == 1 and next(iter(run_ids)) != job_id:
        out["torchelastic_run_id"] = next(iter(run_ids))
    display = _display(out)
    if display:
        out["display"] = display
    return out


def _display(names: Mapping[str, Any]) -> str | None:
    if "slurm_job" in names:
        name = names.get("slurm_job_name")
        return f"slurm job {names['slurm_job']}" + (f" ({name})" if name else "")
    if "k8s_pods" in names:
        pods = names["k8s_pods"]
        where = f"{names['k8s_namespace']}/" if "k8s_namespace" in names else ""
        more = len(pods) - 1 + names.get("k8s_pods_more", 0)
        return f"pod {where}{pods[0]}" + (f" (+{more} more)" if more else "")
    if "torchelastic_run_id" in names:
        return f"torchelastic run {names['torchelastic_run_id']}"
    return None
