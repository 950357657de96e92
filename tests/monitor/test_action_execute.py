"""Carrying out an action (monitor/engine/actions/execute.py): real commands, a real HTTP server for webhooks."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from monitor.engine.actions.config import ActionConfig, ActionRule
from monitor.engine.actions.engine import ActionEngine
from monitor.engine.actions.execute import NotRun, command_line, payload, post_webhook, run_command
from monitor.engine.actions.orders import AgentOrders
from monitor.engine.actions.policy import ACT, Culprit, Decision, JobFacts

RULE = ActionRule("cancel", frozenset({"deadlock"}), 1.0, "command", command=("scancel", "{slurm_job}", "--signal={rule}"))


def decision(names: dict | None = None) -> Decision:
    facts = JobFacts("job-a", "deadlock", "rank 0 waits in all_reduce; rank 1 never reached it",
                     (Culprit(1, "node-b", 4242, 100.0),), {"slurm_job": "77.0", "display": "slurm job 77.0"}
                     if names is None else names)
    return Decision(RULE, facts, 1000.0, 12.5, ACT)


def test_the_payload_names_the_job_the_culprits_and_the_evidence() -> None:
    body = payload(decision(), "http://monitor:8787/?job=job-a", dry_run=False)
    assert body["job_id"] == "job-a" and body["job"] == "slurm job 77.0" and body["slurm_job"] == "77.0"
    assert body["culprit_ranks"] == [1] and body["culprit_nodes"] == ["node-b"]
    assert body["culprits"] == [{"rank": 1, "node": "node-b", "pid": 4242}]
    assert body["evidence_url"] == "http://monitor:8787/?job=job-a" and body["held_s"] == 12.5
    assert "display" not in body


def test_placeholders_are_filled_and_a_missing_one_skips_the_command() -> None:
    assert command_line(RULE, payload(decision(), None, False)) == ["scancel", "77.0", "--signal=cancel"]
    assert command_line(RULE, payload(decision(names={}), None, False)) == \
        NotRun("skipped", "the job has no slurm_job for '{slurm_job}'")


KUBECTL = ActionRule("delete", frozenset({"deadlock"}), 1.0, "command",
                     command=("kubectl", "delete", "pod", "-n", "{k8s_namespace}", "--", "{k8s_pods}"))


@pytest.mark.parametrize(("names", "argv"), [
    ({"slurm_job": "77"}, ["scancel", "77", "--signal=cancel"]),
    ({"slurm_job": "77_3.batch"}, ["scancel", "77_3.batch", "--signal=cancel"]),
    ({"slurm_job": "77_3.0"}, ["scancel", "77_3.0", "--signal=cancel"]),
])
def test_slurm_job_ids_as_slurm_writes_them_are_taken(names: dict, argv: list[str]) -> None:
    assert command_line(RULE, payload(decision(names=names), None, False)) == argv


def test_each_pod_is_an_argument_of_its_own_where_the_placeholder_is_the_whole_argument() -> None:
    names = {"k8s_namespace": "team-a", "k8s_pods": ["trainer-0", "trainer-1.workers"]}
    assert command_line(KUBECTL, payload(decision(names=names), None, False)) == \
        ["kubectl", "delete", "pod", "-n", "team-a", "--", "trainer-0", "trainer-1.workers"]


@pytest.mark.parametrize(("rule", "names", "field"), [
    (RULE, {"slurm_job": "--user=root"}, "slurm_job"),
    (RULE, {"slurm_job": "-1"}, "slurm_job"),
    (RULE, {"slurm_job": "77 --user=root"}, "slurm_job"),
    (RULE, {"slurm_job": "77;reboot"}, "slurm_job"),
    (RULE, {"slurm_job": "77\n78"}, "slurm_job"),
    (KUBECTL, {"k8s_namespace": "kube-system", "k8s_pods": ["--all"]}, "k8s_pods"),
    (KUBECTL, {"k8s_namespace": "--all-namespaces", "k8s_pods": ["p"]}, "k8s_namespace"),
    (KUBECTL, {"k8s_namespace": "a, b", "k8s_pods": ["p"]}, "k8s_namespace"),  # a job over two namespaces
    (KUBECTL, {"k8s_namespace": "Team", "k8s_pods": ["p"]}, "k8s_namespace"),
    (KUBECTL, {"k8s_namespace": "ns", "k8s_pods": ["ok", "-f"]}, "k8s_pods"),
    (KUBECTL, {"k8s_namespace": "ns", "k8s_pods": ["x" * 254]}, "k8s_pods"),
])
def test_a_placeholder_outside_its_format_refuses_the_command(rule: ActionRule, names: dict, field: str) -> None:
    refused = command_line(rule, payload(decision(names=names), None, False))
    assert isinstance(refused, NotRun) and refused.outcome == "refused", refused
    assert refused.detail.startswith(f"{{{field}}} is ") and "never an option" in refused.detail


def test_a_job_id_or_node_name_that_opens_with_a_dash_refuses_the_command() -> None:
    rule = ActionRule("page", frozenset({"deadlock"}), 1.0, "command", command=("page", "{job_id}", "{culprit_nodes}"))
    assert command_line(rule, payload(decision(), None, False)) == ["page", "job-a", "node-b"]
    forged = decision()
    forged = Decision(RULE, JobFacts("--exec=x:29500", "deadlock", "", forged.facts.culprits, {}), 1000.0, 1.0, ACT)
    assert command_line(rule, payload(forged, None, False)).outcome == "refused"
    forged = Decision(RULE, JobFacts("job-a", "deadlock", "", (Culprit(1, "-node", 1),), {}), 1000.0, 1.0, ACT)
    assert command_line(rule, payload(forged, None, False)).outcome == "refused"


def _run(argv: list[str], timeout: float = 10.0) -> tuple[bool, str]:
    return asyncio.run(run_command(argv, payload(decision(), None, False), timeout))


def test_a_command_gets_the_json_on_stdin_and_the_job_in_its_environment() -> None:
    script = ("import json, os, sys; body = json.load(sys.stdin); "
              "print(body['job_id'], body['culprit_ranks'], os.environ['HANGWATCH_CULPRIT_NODES'])")
    assert _run([sys.executable, "-c", script]) == (True, "exit 0: job-a [1] node-b")


@pytest.mark.parametrize(("argv", "expected"), [
    ([sys.executable, "-c", "import sys; print('no such job'); sys.exit(3)"], (False, "exit 3: no such job")),
    (["/nonexistent/scancel"], (False, "could not start /nonexistent/scancel: No such file or directory")),
])
def test_a_failing_command_is_an_outcome_not_an_exception(argv: list[str], expected: tuple[bool, str]) -> None:
    assert _run(argv) == expected


def test_a_command_that_hangs_is_killed_at_its_timeout() -> None:
    ok, detail = _run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1.0)
    assert not ok and detail == "still running after 1s: killed"


class _Hook:
    def __init__(self, status: int) -> None:
        self.bodies: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                hook.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"gone")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hook_factory() -> Iterator:
    made: list[_Hook] = []

    def make(status: int) -> _Hook:
        made.append(_Hook(status))
        return made[-1]

    yield make
    for hook in made:
        hook.server.shutdown()
        hook.server.server_close()


async def _post(url: str) -> tuple[bool, str]:
    async with httpx.AsyncClient() as client:
        return await post_webhook(client, url, payload(decision(), None, False), 5.0)


def test_a_webhook_gets_the_json(hook_factory) -> None:
    hook = hook_factory(204)
    assert asyncio.run(_post(hook.url)) == (True, "HTTP 204")
    assert hook.bodies[0]["job_id"] == "job-a" and hook.bodies[0]["verdict"] == "deadlock"


def test_a_webhook_that_refuses_or_is_down_is_a_failed_outcome(hook_factory) -> None:
    assert asyncio.run(_post(hook_factory(410).url)) == (False, "HTTP 410: gone")
    hook = hook_factory(200)
    hook.server.shutdown()
    hook.server.server_close()
    ok, detail = asyncio.run(_post(hook.url))
    assert not ok and detail.startswith("ConnectError"), detail


def test_an_unattributed_job_is_never_acted_on_but_its_audit_entry_says_what_would_run(store, clock, tmp_path) -> None:
    """dry_run off and a real command: the refusal holds, the audit entry carries the filled command."""
    mark = tmp_path / "ran"
    rule = ActionRule("cancel", frozenset({"deadlock"}), 0.0, "command",
                      command=(sys.executable, "-c", f"open({str(mark)!r}, 'w')", "{slurm_job}"))
    engine = ActionEngine(ActionConfig((rule,), dry_run=False), store, AgentOrders(), clock=clock)
    why = "node node-b reports with a shared token (or none): another client could have spoken for it"
    engine.observe(JobFacts("job-a", "deadlock", "", (Culprit(1, "node-b", 4242),), {"slurm_job": "77"}, why), clock())

    async def run() -> None:
        async with httpx.AsyncClient() as client:
            await engine.run_pending(client)
    asyncio.run(run())
    assert not mark.exists()
    [entry] = [engine.as_json(r) for r in engine.audit("job-a")]
    assert (entry["outcome"], entry["ran"]) == ("unattributed", False), entry
    assert entry["target"] == f"{sys.executable} -c open({str(mark)!r}, 'w') 77", entry
    assert entry["detail"].startswith(f"not run: {why}. The rule would run: {entry['target']}."), entry
