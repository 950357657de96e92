"""Flight Recorder end to end: a real 2-rank gloo job writes its dumps (torch's own
``_dump_fr_trace()``, every second, to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``), rank 1 stops
issuing collectives, the real agent reads the files and the real monitor names rank 1 with
the dumps' evidence.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import STALL_STEP, VERDICT_TIMEOUT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

BEHIND = "Flight Recorder, pg 0: rank 1 last enqueued #"


def test_the_dumps_name_the_rank_that_stopped_issuing_collectives(torchrun_job, wait_for_verdict, tmp_path):
    prefix = tmp_path / "fr" / "rank_"
    job = torchrun_job("--fail", "linger", "--fail-at-step", str(STALL_STEP), "--fr-dump-every", "1",
                       env={"TORCH_FR_DUMP_TEMP_FILE": str(prefix)})
    # The verdict can come a report before the dumps written after the stall: wait for both.
    got = wait_for_verdict(job, "deadlock", VERDICT_TIMEOUT + 15, culprits=[1],
                           where=lambda j: any(e.startswith(BEHIND) for e in j["evidence"]))
    line = next(e for e in got["evidence"] if e.startswith(BEHIND))
    # Rank 1 left before the all_reduce rank 0 now waits in: one collective behind.
    behind, ahead = (int(part.split("#")[1].split()[0]) for part in line.split(" while "))
    assert ahead == behind + 1 and "(all_reduce)" in line, line
    assert (tmp_path / "fr" / "rank_0").is_file() and (tmp_path / "fr" / "rank_1").is_file()
    dumps = {r["rank"]: r["flight_recorder"] for r in got["ranks"]}
    assert dumps[1]["path"] == f"{prefix}1" and dumps[1]["status"] == "ok"
    assert [g["last_enqueued"] for g in dumps[0]["groups"] if g["pg"] == "0"] == [ahead]
