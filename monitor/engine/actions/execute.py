"""Carrying out one decided action (I/O): a command, a webhook. Signals go through the agents
(monitor/engine/actions/orders.py). Every outcome is a short line for the audit log; nothing here raises."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monitor.engine.actions.config import ActionRule
from monitor.engine.actions.placeholders import PlaceholderRefused, checked_values, fill, used_in
from monitor.engine.actions.policy import Decision

if TYPE_CHECKING:  # imported where a webhook is posted: a monitor without actions starts without it
    import httpx

OUTPUT_KEPT = 300  # characters of a command's output kept in the audit log


def payload(decision: Decision, evidence_url: str | None, dry_run: bool) -> dict[str, Any]:
    """The job's identity and the verdict, as a command's stdin and a webhook's body (pure)."""
    facts = decision.facts
    names = {k: v for k, v in facts.names.items() if k != "display"}
    return {
        "job_id": facts.job_id,
        "job": facts.names.get("display") or facts.job_id,
        **names,
        "verdict": facts.verdict,
        "summary": facts.summary,
        "culprit_ranks": sorted({c.rank for c in facts.culprits}),
        "culprit_nodes": sorted({c.node for c in facts.culprits}),
        "culprits": [{"rank": c.rank, "node": c.node, "pid": c.pid} for c in facts.culprits],
        "incident_started_at": decision.incident_started_at,
        "held_s": round(decision.held_s, 1),
        "evidence_url": evidence_url,
        "rule": decision.rule.name,
        "dry_run": dry_run,
    }


@dataclass(frozen=True)
class NotRun:
    """Why a command is not run: ``skipped`` (the job has no value for a placeholder) or
    ``refused`` (a value that is not data of its kind: monitor/engine/actions/placeholders.py)."""

    outcome: str
    detail: str


def command_line(rule: ActionRule, fields: dict[str, Any]) -> list[str] | NotRun:
    """The rule's arguments with their placeholders filled (pure), or why it must not run: a job
    with no Slurm id is never given ``scancel ''``, nor one whose Slurm id is ``--user=root``."""
    try:
        values = checked_values(fields, used_in(rule.command))
    except PlaceholderRefused as refused:
        return NotRun("refused", str(refused))
    argv: list[str] = []
    for arg in rule.command:
        try:
            argv += fill(arg, values)
        except KeyError as missing:
            return NotRun("skipped", f"the job has no {missing.args[0]} for {arg!r}")
    return argv


async def run_command(argv: list[str], body: dict[str, Any], timeout_s: float) -> tuple[bool, str]:
    """Run ``argv`` (no shell) with the JSON on stdin and HANGWATCH_* in its environment."""
    env = dict(os.environ, HANGWATCH_JOB_ID=str(body["job_id"]), HANGWATCH_VERDICT=str(body["verdict"]),
               HANGWATCH_CULPRIT_RANKS=",".join(map(str, body["culprit_ranks"])),
               HANGWATCH_CULPRIT_NODES=",".join(body["culprit_nodes"]))
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=env, start_new_session=True)
    except OSError as exc:
        return False, f"could not start {argv[0]}: {exc.strerror or exc}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(json.dumps(body).encode()), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return False, f"still running after {timeout_s:.0f}s: killed"
    text = out.decode("utf-8", "replace").strip()[-OUTPUT_KEPT:]
    said = f": {text}" if text else ""
    if proc.returncode == 0:
        return True, f"exit 0{said}"
    return False, f"exit {proc.returncode}{said}"


async def post_webhook(client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout_s: float) -> tuple[bool, str]:
    from hangwatch_common.http_client import httpx

    try:
        response = await client.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {exc}"[:OUTPUT_KEPT]
    if response.is_success:
        return True, f"HTTP {response.status_code}"
    return False, f"HTTP {response.status_code}: {response.text[:OUTPUT_KEPT]}"
