"""Whether a job's verdict may be acted on (monitor/engine/attribution.py), table-style over MonitorState
fed reports from two nodes with node-bound tokens; a fuzz over ranks' environments shows no
command argument outside its placeholder's format (monitor/engine/actions/placeholders.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from monitor_reports import rank, report

from monitor.engine.actions.config import ActionRule
from monitor.engine.actions.execute import NotRun, command_line, payload
from monitor.engine.actions.placeholders import FORMATS
from monitor.engine.actions.policy import ACT, Culprit, Decision, JobFacts
from monitor.engine.attribution import LATE_JOIN_S, why_unattributed
from monitor.engine.job_names import job_names
from monitor.ingest.state import MonitorState
from monitor.ingest.wire import Report

T0 = 1_700_000_000.0
ENDED = {"alive": False, "exit": {"at": T0, "code": 1, "source": "proc"}}


def _post(state: MonitorState, node: str, at: float, *ranks: dict) -> None:
    state.apply(Report.model_validate(report(node=node, ranks=list(ranks), sent_at=at)), at)
    state.nodes[node].attributed = True


def _job(node_b_env: dict, node_b_rank: dict, joined_after_s: float) -> tuple[MonitorState, str | None]:
    state = MonitorState()
    slurm = {"SLURM_JOB_ID": "77"}
    _post(state, "node-a", T0, rank(job_id="job", rank=0, world_size=4, env=slurm),
          rank(job_id="job", rank=1, world_size=4, env=slurm))
    at = T0 + joined_after_s
    _post(state, "node-a", at, rank(job_id="job", rank=0, world_size=4, env=slurm),
          rank(job_id="job", rank=1, world_size=4, env=slurm))
    _post(state, "node-b", at, rank(job_id="job", world_size=4, env=node_b_env, **node_b_rank))
    return state, why_unattributed(state.jobs["job"], [2], state.nodes, at)


# (node-b's rank 2: its environment, what it says, seconds after the job began) -> why not (None: it may act).
CASES = {
    "a node there from the start, its rank alive": ({"SLURM_JOB_ID": "77"}, {"rank": 2}, 0.0, None),
    "a late node's rank, seen alive": ({"SLURM_JOB_ID": "77"}, {"rank": 2, "pid": 7002}, LATE_JOIN_S + 5, None),
    "a late node's rank, only said to have ended": ({"SLURM_JOB_ID": "77"}, {"rank": 2, **ENDED}, LATE_JOIN_S + 5,
                                                   "rank 2 was never seen alive"),
    "a rank naming another Slurm job": ({"SLURM_JOB_ID": "--user=root"}, {"rank": 2}, 0.0,
                                       "the job's ranks name it differently"),
    "a rank naming no Slurm job": ({"PATH": "/bin"}, {"rank": 2}, 0.0, "the job's ranks name it differently"),
    "a rank whose environment is not known yet": ({}, {"rank": 2}, 0.0, None),
}


@pytest.mark.parametrize("env,said,after_s,why", CASES.values(), ids=CASES.keys())
def test_when_a_verdict_may_be_acted_on(env: dict, said: dict, after_s: float, why: str | None) -> None:
    _, reason = _job(env, said, after_s)
    assert (reason is None) if why is None else (reason is not None and reason.startswith(why)), reason


def test_a_node_on_a_shared_token_makes_the_job_unattributed() -> None:
    state, _ = _job({"SLURM_JOB_ID": "77"}, {"rank": 2}, 0.0)
    state.nodes["node-b"].attributed = False
    reason = why_unattributed(state.jobs["job"], [2], state.nodes, T0)
    assert reason is not None and reason.startswith("node node-b reports with a shared token")


ENV_KEYS = ["SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_STEP_ID", "POD_UID", "HOSTNAME", "TORCHELASTIC_RUN_ID"]
HOSTILE = st.one_of(st.text(max_size=40), st.sampled_from(["--all", "-1", "a b", "x\n-y", "--user=root", "Kube",
                                                            "ns;rm -rf /", "a, b", "7 7", ""]))


def _values(plausible: str) -> st.SearchStrategy[str]:
    """Values as the field's source writes them, half the time; anything a node may send, the rest."""
    return st.one_of(st.from_regex(plausible, fullmatch=True), HOSTILE)


SLURM, NAME, ANY = _values(r"[0-9]{1,6}"), _values(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?"), _values(r"[ -~]{1,12}")
RULE = ActionRule("act", frozenset({"deadlock"}), 0.0, "command",
                  command=("tool", "--", "{slurm_job}", "{k8s_namespace}", "{k8s_pods}", "{job_id}", "{culprit_nodes}",
                           "{culprit_ranks}", "{rule}"))
FILLED = ("slurm_job", "k8s_namespace", "k8s_pods", "job_id", "culprit_nodes", "culprit_ranks", "rule")


@settings(max_examples=500, deadline=None)
@given(envs=st.lists(st.fixed_dictionaries({"SLURM_JOB_ID": SLURM, "POD_NAMESPACE": NAME, "POD_NAME": NAME},
                                           optional=dict.fromkeys(ENV_KEYS, ANY)), min_size=1, max_size=3),
       job_id=st.one_of(NAME, ANY), node=st.one_of(NAME, ANY))
def test_fuzz_no_command_argument_outside_its_format(envs: list[dict], job_id: str, node: str) -> None:
    facts = JobFacts(job_id or "j", "deadlock", "", (Culprit(1, node or "n", 5),), job_names(job_id, envs))
    argv = command_line(RULE, payload(Decision(RULE, facts, T0, 1.0, ACT), None, dry_run=False))
    if isinstance(argv, NotRun):
        return
    assert argv[:2] == ["tool", "--"]
    items = argv[2:]
    pods = facts.names.get("k8s_pods", [])
    # One argument per placeholder, but {k8s_pods}, one per pod.
    expected = ["slurm_job", "k8s_namespace", *(["k8s_pods"] * len(pods)), "job_id", "culprit_nodes",
                "culprit_ranks", "rule"]
    assert len(items) == len(expected)
    for name, item in zip(expected, items, strict=True):
        assert name in FILLED
        assert not item.startswith("-"), (name, item)
        parts = item.split(",") if name in ("culprit_nodes", "culprit_ranks") else [item]
        assert all(FORMATS[name].fullmatch(part) for part in parts), (name, item)
        assert not re.search(r"[\s;\x00-\x1f]", item), (name, item)
