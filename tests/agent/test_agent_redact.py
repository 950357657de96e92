"""Command-line redaction (agent/redact.py): table-style on argv and text, then every path a
command line takes into a report (ranks, launchers, leftovers, Lightning's parent, the holder of
a port) on a fake /proc tree, then the real agent on a real process with a token in its argv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.discovery import Discovery, allowlisted_env
from agent.redact import CMDLINE_MAX_CHARS, DEFAULT_REDACTOR, make_redactor
from tests.agent.conftest import run_agent_once
from tests.agent.fake_proc import fake_process

R = DEFAULT_REDACTOR


@pytest.mark.parametrize(
    "argv, expected",
    [
        # option=value and option value, double and single dash, any case
        (["python", "train.py", "--hf_token=hf_abc"], ["python", "train.py", "--hf_token=***"]),
        (["train.py", "--hf_token", "hf_abc", "--lr", "0.1"], ["train.py", "--hf_token", "***", "--lr", "0.1"]),
        (["train.py", "--HF-TOKEN", "x"], ["train.py", "--HF-TOKEN", "***"]),
        (["t.py", "-password", "hunter2"], ["t.py", "-password", "***"]),
        (["java", "-Ddb.password=hunter2", "Main"], ["java", "-Ddb.password=***", "Main"]),
        (["t.py", "--passwd=x", "--db-secret", "y"], ["t.py", "--passwd=***", "--db-secret", "***"]),
        (["t.py", "--openai_api_key", "sk-1", "--aws-secret-access-key=z"],
         ["t.py", "--openai_api_key", "***", "--aws-secret-access-key=***"]),
        (["t.py", "--gcp-credentials", "{...}"], ["t.py", "--gcp-credentials", "***"]),
        # a secret option without a value, or followed by another option: nothing to hide
        (["t.py", "--token"], ["t.py", "--token"]),
        (["t.py", "--use-token", "--lr", "1"], ["t.py", "--use-token", "--lr", "1"]),
        (["t.py", "--token="], ["t.py", "--token="]),
        # the value of "--x value" is the next word even when it holds spaces
        (["t.py", "--token", "two words"], ["t.py", "--token", "***"]),
        # NAME=value words: env, Hydra overrides
        (["env", "HF_TOKEN=hf_abc", "python", "t.py"], ["env", "HF_TOKEN=***", "python", "t.py"]),
        (["t.py", "wandb.api_key=abc", "+db.password=p", "lr=0.1"],
         ["t.py", "wandb.api_key=***", "+db.password=***", "lr=0.1"]),
        # URL credentials anywhere, in any option
        (["t.py", "--db", "postgres://u:p@ss@h:5432/db"], ["t.py", "--db", "postgres://u:***@h:5432/db"]),
        (["t.py", "--repo=https://ghp_abc@github.com/o/r"], ["t.py", "--repo=https://***@github.com/o/r"]),
        (["t.py", "https://h/x?token=abc&page=2"], ["t.py", "https://h/x?token=***&page=2"]),
        (["curl", "-H", "Authorization: Bearer abc.def"], ["curl", "-H", "Authorization: Bearer ***"]),
        (["curl", "-H", "Authorization: Basic dTpw"], ["curl", "-H", "Authorization: Basic ***"]),
        # one argv word holding a shell command, or a title set with setproctitle
        (["bash", "-c", "HF_TOKEN=abc python train.py --api-key 'k1' --lr 1"],
         ["bash", "-c", "HF_TOKEN=*** python train.py --api-key *** --lr 1"]),
        (["python train.py --hf_token=abc"], ["python train.py --hf_token=***"]),
        # substring on purpose: safe side, documented (model flags lose their values too)
        (["t.py", "--max_tokens", "5", "--tokenizer", "gpt2"], ["t.py", "--max_tokens", "***", "--tokenizer", "***"]),
        (["t.py", "--monkey-patch", "x"], ["t.py", "--monkey-patch", "***"]),
        # must NOT be redacted
        (["python", "-u", "train.py", "--lr", "0.1", "--epochs", "3"],
         ["python", "-u", "train.py", "--lr", "0.1", "--epochs", "3"]),
        (["t.py", "--keep-going", "data"], ["t.py", "--keep-going", "data"]),
        (["t.py", "--config", "/etc/keys/app.yaml"], ["t.py", "--config", "/etc/keys/app.yaml"]),
        (["/home/keyser/token_tools/train.py"], ["/home/keyser/token_tools/train.py"]),
        (["torchrun", "--nproc-per-node=2", "--master-addr", "10.0.0.1", "--master-port=29500", "t.py"],
         ["torchrun", "--nproc-per-node=2", "--master-addr", "10.0.0.1", "--master-port=29500", "t.py"]),
        (["t.py", "--url", "http://10.0.0.5:8787/x"], ["t.py", "--url", "http://10.0.0.5:8787/x"]),
        (["git", "clone", "git@github.com:o/r.git"], ["git", "clone", "git@github.com:o/r.git"]),
        (["t.py", "--mail", "ops@example.com"], ["t.py", "--mail", "ops@example.com"]),
        (["t.py", "--lr", "-0.1"], ["t.py", "--lr", "-0.1"]),
        (["t.py", "--", "positional"], ["t.py", "--", "positional"]),
        ([], []),
    ],
)
def test_redact_argv(argv, expected):
    assert R.argv(argv) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("10.0.0.1", "10.0.0.1"),
        ("node-7.example.internal", "node-7.example.internal"),
        ("tcp://user:pw@10.0.0.1:29500", "tcp://user:***@10.0.0.1:29500"),
        ("https://tok@h", "https://***@h"),
        ("https://h:8443/p?a=1&api_key=z#f", "https://h:8443/p?a=1&api_key=***#f"),
        ("/tmp/fr_dump_", "/tmp/fr_dump_"),
        ("see https://a:b@h and http://c:d@i", "see https://a:***@h and http://c:***@i"),
    ],
)
def test_redact_text(text, expected):
    assert R.text(text) == expected


@pytest.mark.parametrize(
    "extra, defaults, argv, expected",
    [
        (["^wandb"], True, ["t.py", "--wandb-entity", "team", "--hf_token=x"],
         ["t.py", "--wandb-entity", "***", "--hf_token=***"]),
        ([], False, ["t.py", "--hf_token=x", "--db=http://u:p@h"], ["t.py", "--hf_token=x", "--db=http://u:***@h"]),
        (["^tokenizer$"], False, ["t.py", "--tokenizer", "gpt2", "--max_tokens", "5"],
         ["t.py", "--tokenizer", "***", "--max_tokens", "5"]),
        (["(?-i:^Salt$)"], False, ["t.py", "--Salt", "x", "--salt", "y"], ["t.py", "--Salt", "***", "--salt", "y"]),
    ],
)
def test_redact_patterns_configurable(extra, defaults, argv, expected):
    assert make_redactor(extra, defaults).argv(argv) == expected


def test_cut_to_length_after_redaction():
    """The cut comes last: a secret straddling the limit is never half-shown."""
    argv = ["python", "x" * (CMDLINE_MAX_CHARS - 20), "--hf_token=" + "s" * 100]
    line = R.cmdline(argv)
    assert len(line) <= CMDLINE_MAX_CHARS and "s" * 5 not in line


def test_allowlisted_env_hides_url_credentials():
    env = {"MASTER_ADDR": "https://user:pw@10.0.0.1", "GLOO_SOCKET_IFNAME": "eth0", "HF_TOKEN": "x"}
    assert allowlisted_env(env) == {"MASTER_ADDR": "https://user:***@10.0.0.1", "GLOO_SOCKET_IFNAME": "eth0"}


# --- every path a command line takes, on a fake /proc ----------------------------------------


def test_every_reported_cmdline_is_redacted(tmp_path: Path):
    root = tmp_path / "proc"
    root.mkdir()
    (root / "uptime").write_text("100000.00 1.00\n")
    rank_env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "http://u:S-ENV@127.0.0.1", "MASTER_PORT": "29511"}
    fake_process(root, 100, 50, ["python3", "/usr/bin/torchrun", "--nproc-per-node=1",
                                  "--rdzv-endpoint=https://u:S-LAUNCHER@h:29400", "train.py", "--hf_token", "S-1"], {})
    fake_process(root, 101, 100, ["python3", "train.py", "--hf_token", "S-RANK"], rank_env)
    fake_process(root, 200, 1, ["python3", "-m", "torch.distributed.run", "--password=S-ORPHAN", "train.py"], {})
    # Lightning: the parent (local rank 0, no rank variables) and a child that runs it again
    # (the same arguments: the raw argv decides that, the redacted one is only reported).
    fake_process(root, 300, 50, ["python3", "fit.py", "--api-key", "S-LIGHTNING"], {})
    fake_process(root, 301, 300, ["python3", "/w/fit.py", "--api-key", "S-LIGHTNING"],
                  {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": "29512"})
    fake_process(root, 400, 1, ["python3", "server.py", "--secret-key=S-HOLDER"], {})

    discovery = Discovery(proc_root=str(root), self_pid=999999)
    ranks = discovery.scan()
    assert {r.pid for r in ranks} == {101, 300, 301}  # the Lightning pair found: the derived path ran
    assert [p.pid for p in discovery.launchers] == [100, 200]  # a leftover launcher is both
    assert [o.pid for o in discovery.orphans] == [200]
    reported = {
        "ranks": [(r.cmdline, r.env) for r in ranks],
        "launchers": [p.cmdline for p in discovery.launchers],
        "orphans": [o.cmdline for o in discovery.orphans],
        "port holder": discovery.cmdline_of(400),
    }
    assert "S-" not in json.dumps(reported), reported
    assert "--hf_token ***" in dict((r.pid, r.cmdline) for r in ranks)[101]
    assert "--rdzv-endpoint=https://u:***@h:29400" in discovery.launchers[0].cmdline


# --- the real agent on a real process ----------------------------------------------------------

# A stand-in for torchrun (its file name is what makes it one) that starts one rank.
FAKE_TORCHRUN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    script, port = os.environ["RANK_SCRIPT"], os.environ["JOB_PORT"]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    child = subprocess.Popen([sys.executable, script, "sleep", "--hf_token=hf_secret123"], env=env)
    print(f"child {child.pid}", flush=True)
    child.wait()
    """
)


def test_live_agent_report_never_holds_the_token(ranks, tmp_path: Path):
    torchrun = tmp_path / "torchrun"
    torchrun.write_text(FAKE_TORCHRUN)
    log = open(ranks.log_path(9), "w")
    env = {"PATH": os.environ.get("PATH", ""), "RANK_SCRIPT": str(ranks.script), "JOB_PORT": str(ranks.port)}
    launcher = subprocess.Popen(
        [sys.executable, str(torchrun), "--nproc-per-node=1", "--rdzv-endpoint=https://user:hf_secret123@127.0.0.1:1",
         str(ranks.script), "--hf_token", "hf_secret123"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    ranks.procs.append(launcher)
    ranks.extra_pids.append(int(ranks.wait_for_line(9, "child ").split()[1]))
    ranks.wait_for_line(9, "step ")

    report = run_agent_once("--interval", "0.3", "--job", ranks.job)

    (rank,) = [r for r in report["ranks"] if r["job_id"] == ranks.job]
    assert rank["cmdline"].endswith("sleep --hf_token=***")
    (tracked,) = [t for t in report["launchers"] if t["pid"] == launcher.pid]
    assert "--rdzv-endpoint=https://user:***@127.0.0.1:1" in tracked["cmdline"]
    assert "hf_secret123" not in json.dumps(report)
