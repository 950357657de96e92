"""One real hung job in a pod, found by the real agent, read two ways.

- The names people know a job by (Slurm job, Kubernetes pod), from the ranks' environment, as a pod's
  downward API sets it. (A job outside pods and Slurm has no other name: checked on the plain linger
  deadlock of tests/e2e/test_ranks_outrank_logs.py.)
- Flight Recorder: the job writes its dumps (torch's own ``_dump_fr_trace()``, every second, to
  ``$TORCH_FR_DUMP_TEMP_FILE<rank>``), rank 1 stops issuing collectives, the agent reads the files
  and the monitor names rank 1 with the dumps' evidence.

Both from one job (module-scoped): neither reading changes the other, and a job is most of a test's
cost on 2 cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hangwatch.demo.harness import Job, MonitorClient, Reaper, Service, launch_torchrun
from tests.e2e.conftest import STALL_STEP, VERDICT_TIMEOUT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

LINGER = ("--fail", "linger", "--fail-at-step", str(STALL_STEP))
POD_UID = "0b5c1f6e-1a2b-4c3d-8e9f-001122334455"
POD = {"POD_NAME": "trainer-worker-0", "POD_NAMESPACE": "ml-team", "POD_UID": POD_UID}
BEHIND = "Flight Recorder, pg 0: rank 1 last enqueued #"


@pytest.fixture(scope="module")
def hung_pod_job(tmp_path_factory: pytest.TempPathFactory, agent: Service, monitor: Service,
                 client: MonitorClient) -> Iterator[tuple[Job, dict, Path]]:
    """(the job, its deadlock answer with the dumps' evidence, the dumps' folder)."""
    workdir = tmp_path_factory.mktemp("hung-pod-job")
    dumps = workdir / "fr"
    reaper = Reaper()
    try:
        job = launch_torchrun(reaper, workdir, [*LINGER, "--fr-dump-every", "1"],
                              env={**POD, "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "rank_")})
        job.rank_pids(timeout=30)  # record the workers in the reaper at once
        # The verdict can come a report before the dumps written after the stall: wait for both.
        try:
            got = client.wait_for_verdict(
                job.job_id, "deadlock", VERDICT_TIMEOUT + 15, culprits=[1],
                where=lambda j: any(e.startswith(BEHIND) for e in j["evidence"]),
                context=lambda: "\n".join([f"job log:\n{job.log_tail()}", f"agent log:\n{agent.log_tail(15)}",
                                           f"monitor log:\n{monitor.log_tail(15)}"]))
        except AssertionError as e:
            pytest.fail(str(e), pytrace=False)
        yield job, got, dumps
    finally:
        reaper.close()


def test_a_job_in_a_pod_is_known_by_its_namespace_and_pod(hung_pod_job, client):
    job, got, _ = hung_pod_job
    assert got["names"]["k8s_namespace"] == "ml-team"
    assert got["names"]["k8s_pods"] == ["trainer-worker-0"]
    assert got["names"]["display"] == "pod ml-team/trainer-worker-0"
    assert {r["k8s_pod"] for r in got["ranks"]} == {"trainer-worker-0"}
    assert "known as pod ml-team/trainer-worker-0" in client.diagnose_text(job.job_id)


def test_the_dumps_name_the_rank_that_stopped_issuing_collectives(hung_pod_job):
    _, got, dumps = hung_pod_job
    line = next(e for e in got["evidence"] if e.startswith(BEHIND))
    # Rank 1 left before the all_reduce rank 0 now waits in: one collective behind.
    behind, ahead = (int(part.split("#")[1].split()[0]) for part in line.split(" while "))
    assert ahead == behind + 1 and "(all_reduce)" in line, line
    assert (dumps / "rank_0").is_file() and (dumps / "rank_1").is_file()
    ranks = {r["rank"]: r["flight_recorder"] for r in got["ranks"]}
    assert ranks[1]["path"] == f"{dumps / 'rank_'}1" and ranks[1]["status"] == "ok"
    assert [g["last_enqueued"] for g in ranks[0]["groups"] if g["pg"] == "0"] == [ahead]
