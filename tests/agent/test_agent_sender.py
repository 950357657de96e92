"""The sender against a real HTTP receiver on loopback: 2xx, 4xx (logged once), 5xx (retry)."""

from __future__ import annotations

import logging
import time

import pytest

from agent.sender import BACKOFF_MAX_S, Sender, next_backoff, retry_delay
from tests.agent.conftest import Receiver


def test_post_ok_sets_sent_at_at_sending_time():
    receiver = Receiver()
    sender = Sender(receiver.url + "/")
    try:
        before = time.time()
        assert sender.post({"schema_version": 1, "node": "n", "sent_at": 0.0}) is True
        assert receiver.reports[0]["sent_at"] >= before
    finally:
        sender.client.close()
        receiver.close()


def test_4xx_logged_once_and_5xx_is_a_failure(caplog):
    receiver = Receiver(status=422)
    sender = Sender(receiver.url)
    try:
        with caplog.at_level(logging.ERROR, logger="agent.sender"):
            assert sender.post({"a": 1}) is True
            assert sender.post({"a": 2}) is True
        assert sum("rejected" in r.message for r in caplog.records) == 1
        receiver.status = 503
        assert sender.post({"a": 3}) is False and sender.failed == 1
    finally:
        sender.client.close()
        receiver.close()


def test_background_thread_sends_newest_only():
    receiver = Receiver()
    sender = Sender(receiver.url)
    sender.start()
    try:
        for i in range(50):
            sender.offer({"n": i})
        receiver.wait_for(lambda r: r["n"] == 49, timeout=5)
        assert len(receiver.reports) < 50  # superseded reports were dropped, not queued
        # Each body sent is numbered, in order (monitor/ingest/report_order.py refuses a replayed one).
        numbers = [r["seq"] for r in receiver.reports]
        assert numbers == list(range(1, len(numbers) + 1)), numbers
    finally:
        sender.stop()
        receiver.close()


def test_backoff_doubles_up_to_cap():
    b, seen = 0.0, []
    for _ in range(10):
        b = next_backoff(b)
        seen.append(b)
    assert seen[:3] == [0.5, 1.0, 2.0] and seen[-1] == BACKOFF_MAX_S


@pytest.mark.parametrize("backoff, retry_after, draw, expected", [
    (4.0, None, 0.0, 2.0),      # a failed try: at least half the backoff
    (4.0, None, 1.0, 4.0),      # at most all of it
    (1.0, None, 0.5, 0.75),
    (4.0, 10.0, 0.0, 10.0),     # a shedding monitor's Retry-After is a floor
    (4.0, 10.0, 1.0, 15.0),     # spread over up to half as much again
])
def test_retry_delay_is_jittered_within_its_bounds(backoff, retry_after, draw, expected):
    assert retry_delay(backoff, retry_after, rng=lambda: draw) == pytest.approx(expected)


def test_agents_that_lose_the_monitor_together_do_not_retry_in_lockstep():
    # 1,000 agents at the capped backoff: their next tries spread over half a backoff, not one instant.
    delays = sorted(retry_delay(BACKOFF_MAX_S, None) for _ in range(1000))
    assert delays[0] >= BACKOFF_MAX_S / 2 and delays[-1] <= BACKOFF_MAX_S
    in_busiest_tenth_of_a_second = max(sum(1 for d in delays if t <= d < t + 0.1) for t in delays)
    assert in_busiest_tenth_of_a_second < 100, in_busiest_tenth_of_a_second
