"""The relay's batching, alone (monitor/relay/forwarder.py): the monitor is an httpx mock transport."""

from __future__ import annotations

import asyncio
import json

import httpx

from monitor.relay.forwarder import STALE_S, Forwarder, batch_body


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


def test_a_monitor_that_answers_wrongly_or_not_at_all_is_down_to_the_agents() -> None:
    """502 without Retry-After: agents read it as the monitor down and keep their outage journal."""
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

    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("a fault of the relay's own")

    for handler, needle, counted in ((refuses, "HTTP 401", "monitor_refused_batch"),
                                     (short, "one result per report", "monitor_unreachable"),
                                     (away, "unreachable", "monitor_unreachable"),
                                     (broken, "could not send the batch (RuntimeError)", "monitor_unreachable")):
        answer, counts = asyncio.run(one(handler))
        assert answer.status == 502 and "retry-after" not in answer.headers, answer
        assert needle in answer.body["detail"], answer.body
        assert counts[counted] == 1 and counts["answered"] == 0, counts


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
        # The monitor sits on the batch longer than an agent waits: as good as down to the agents.
        await asyncio.sleep(STALE_S + 0.1)
        hung = await forwarder.forward(b"{}", False)
        release.set()
        answers = [await first] + [await w for w in waiting]
        await forwarder.close()
        return turned_away, hung, answers, forwarder.reports

    turned_away, hung, answers, counts = asyncio.run(run())
    # Busy (503 + Retry-After: the agent comes back later) while the monitor answers in time...
    assert turned_away.status == 503 and "overloaded" in turned_away.body["detail"]
    # ...down (502: the agent keeps its outage journal) once it sits on a batch.
    assert hung.status == 502 and "sat on a batch" in hung.body["detail"] and "retry-after" not in hung.headers
    # The reports that waited behind the hung batch are stale by its answer (their agents gave up).
    assert [a.status for a in answers] == [202, 502, 502, 502]
    assert counts == {"answered": 1, "monitor_unreachable": 0, "monitor_refused_batch": 0, "shed": 2, "stale": 3}


def test_reports_whose_agents_gave_up_waiting_go_no_further_and_closing_answers_everyone() -> None:
    async def run() -> tuple:
        release = asyncio.Event()
        posted: list[int] = []

        async def slow(request: httpx.Request) -> httpx.Response:
            count = len(json.loads(request.content)["reports"])
            posted.append(count)
            await release.wait()
            return httpx.Response(200, json={"results": [{"status": 202, "body": {}}] * count})

        forwarder = _forwarder(slow, flush_s=0.0)
        first = asyncio.ensure_future(forwarder.forward(b"{}", False))  # in flight, the monitor stalled
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(forwarder.forward(b"{}", False))   # waits behind it
        await asyncio.sleep(STALE_S + 0.2)
        release.set()
        answers = [await first, await late]
        # A batch in flight when the relay stops: its agents are answered, not left waiting.
        release.clear()
        stranded = asyncio.ensure_future(forwarder.forward(b"{}", False))
        await asyncio.sleep(0.05)
        await forwarder.close()
        return answers, await asyncio.wait_for(stranded, 2), await forwarder.forward(b"{}", False), posted, \
            forwarder.reports

    answers, stranded, after, posted, counts = asyncio.run(run())
    assert answers[0].status == 202
    # Never sent: its agent had given up. The monitor sat on the batch before it that long: down.
    assert answers[1].status == 502 and "sat on a batch" in answers[1].body["detail"] and counts["stale"] == 1
    assert posted == [1, 1], posted
    assert stranded.status == 503 and "stopping" in stranded.body["detail"]
    assert after.status == 503 and "stopping" in after.body["detail"]
