"""The relay's batching, alone (monitor/relay/forwarder.py): the monitor is an httpx mock transport."""

from __future__ import annotations

import asyncio
import json

import httpx

from monitor.relay.forwarder import Forwarder, batch_body


def test_a_batch_is_the_reports_own_bytes_with_their_attribution() -> None:
    body = batch_body([(b'{"node":"a"}', True), (b'{"node":"b"}', False)])
    assert json.loads(body) == {"reports": [{"attributed": True, "report": {"node": "a"}},
                                            {"attributed": False, "report": {"node": "b"}}]}


def _forwarder(handler, **options) -> Forwarder:  # type: ignore[no-untyped-def]
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return Forwarder("http://monitor", lambda: "relay-token", max_batch_bytes=1 << 20, client=client, **options)


def test_reports_posted_together_share_a_batch_and_each_gets_its_own_answer() -> None:
    batches: list[dict] = []

    def monitor(request: httpx.Request) -> httpx.Response:
        batch = json.loads(request.content)
        batches.append(batch)
        assert request.headers["authorization"] == "Bearer relay-token"
        return httpx.Response(200, json={"results": [{"status": 202, "body": {"node": e["report"]["node"]}}
                                                     for e in batch["reports"]]})

    async def run() -> list:
        forwarder = _forwarder(monitor)
        answers = await asyncio.gather(*(forwarder.forward(b'{"node":"n%d"}' % i, False) for i in range(20)))
        await forwarder.close()
        return answers

    answers = asyncio.run(run())
    assert [a.body["node"] for a in answers] == [f"n{i}" for i in range(20)]
    assert len(batches) == 1 and len(batches[0]["reports"]) == 20


def test_a_monitor_that_answers_wrongly_or_not_at_all_gets_agents_a_503_to_retry() -> None:
    def refuses(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"detail": "the token is not accepted"})

    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"results": []})

    def away(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async def one(handler) -> tuple:  # type: ignore[no-untyped-def]
        forwarder = _forwarder(handler)
        answer = await forwarder.forward(b'{"node":"a"}', False)
        await forwarder.close()
        return answer, forwarder.reports

    for handler, needle in ((refuses, "HTTP 401"), (short, "one result per report"), (away, "unreachable")):
        answer, counts = asyncio.run(one(handler))
        assert answer.status == 503 and answer.headers["retry-after"], answer
        assert needle in answer.body["detail"], answer.body
        assert counts["monitor_unreachable"] == 1 and counts["answered"] == 0


def test_past_its_waiting_room_a_relay_turns_reports_away_at_once() -> None:
    async def run() -> tuple:
        release = asyncio.Event()

        async def slow(request: httpx.Request) -> httpx.Response:
            await release.wait()
            count = len(json.loads(request.content)["reports"])
            return httpx.Response(200, json={"results": [{"status": 202, "body": {}}] * count})

        forwarder = _forwarder(slow, max_waiting=3, flush_s=0.0)
        first = asyncio.ensure_future(forwarder.forward(b"{}", False))  # in flight, the monitor slow
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(forwarder.forward(b"{}", False)) for _ in range(3)]
        await asyncio.sleep(0.05)
        turned_away = await forwarder.forward(b"{}", False)
        release.set()
        answers = [await first] + [await w for w in waiting]
        await forwarder.close()
        return turned_away, answers, forwarder.reports

    turned_away, answers, counts = asyncio.run(run())
    assert turned_away.status == 503 and "overloaded" in turned_away.body["detail"]
    assert [a.status for a in answers] == [202] * 4
    assert counts == {"answered": 4, "monitor_unreachable": 0, "shed": 1}
