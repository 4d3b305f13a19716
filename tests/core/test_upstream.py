"""docs/failure-semantics.md#broker-outages outages, the core's part: a producer reports its broker
lost and back; the group logs one WARNING and one INFO per outage and shows it in ``GroupStats``."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from ackgate import GroupStats, Message, Service, SharedStreamManager
from ackgate.testing import ScriptedProducer

ADDRESS = "broker-1.example:9092"


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ackgate.upstream"]


def only(manager: SharedStreamManager) -> GroupStats:
    (stats,) = manager.stats()
    return stats


async def test_one_warning_and_one_info_per_outage_however_often_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = ScriptedProducer()
    caplog.set_level(logging.INFO, logger="ackgate")
    async with SharedStreamManager() as manager:
        manager.subscribe("orders", "a", producer=lambda: producer)
        await producer.starved.wait()  # the group reads the producer
        assert only(manager).upstream_connected is True
        assert only(manager).upstream_down_since is None
        producer.upstream_back()  # not lost: nothing to say

        before = time.time()
        for _ in range(50):  # one report per failed retry
            producer.upstream_lost(ADDRESS, ConnectionRefusedError(111, "Connection refused"))
        after = time.time()
        down = only(manager)
        assert down.upstream_connected is False
        assert down.upstream_down_since is not None
        assert before <= down.upstream_down_since <= after

        for _ in range(3):
            producer.upstream_back()
        assert only(manager).upstream_connected is True
        assert only(manager).upstream_down_since is None

        producer.upstream_lost(ADDRESS, "no group coordinator")  # a second outage
        producer.upstream_back()

    lines = outage_lines(caplog)
    assert [level for level, _ in lines] == [
        logging.WARNING,
        logging.INFO,
        logging.WARNING,
        logging.INFO,
    ]
    warning = lines[0][1]
    assert "key='orders'" in warning and ADDRESS in warning
    assert "ConnectionRefusedError: [Errno 111] Connection refused" in warning
    assert "back key='orders'" in lines[1][1] and ADDRESS in lines[1][1]
    assert "cause=no group coordinator" in lines[2][1]


async def test_a_service_producer_reports_through_the_message_wrapper(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Service wraps the producer to convert messages; the user's producer is the
    one that reports, and its reports reach the service's group."""
    producer = ScriptedProducer()
    caplog.set_level(logging.INFO, logger="ackgate")
    service = Service("svc", producer=lambda: producer)

    @service.handler("h")
    async def handle(message: Message) -> None:
        pass

    running = asyncio.create_task(service.run())
    await producer.starved.wait()
    producer.upstream_lost(ADDRESS, OSError("unreachable"))
    group = service.stats().group
    assert group is not None and group.upstream_connected is False
    producer.upstream_back()
    group = service.stats().group
    assert group is not None and group.upstream_connected is True
    await service.stop()
    await running
    assert [level for level, _ in outage_lines(caplog)] == [logging.WARNING, logging.INFO]


async def test_an_outage_outlives_a_restart_of_the_group(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A group that ends while its upstream is down hands the outage to the key's
    next group: no second WARNING for the same outage, one INFO when it ends, and
    the closed producer's reports no longer count."""
    first, second = ScriptedProducer(), ScriptedProducer()
    caplog.set_level(logging.INFO, logger="ackgate")
    async with SharedStreamManager() as manager:
        sub = manager.subscribe("k", "a", producer=lambda: first)
        await first.starved.wait()
        first.upstream_lost(ADDRESS, "connection reset")
        since = only(manager).upstream_down_since
        await sub.aclose()  # the group ends while down
        assert first.closed == 1
        first.upstream_back()  # closed: ignored

        manager.subscribe("k", "a", producer=lambda: second)
        await second.starved.wait()
        assert only(manager).upstream_connected is False
        assert only(manager).upstream_down_since == since
        second.upstream_lost(ADDRESS, "connection refused")  # the same outage
        second.upstream_back()
        assert only(manager).upstream_connected is True
    assert [level for level, _ in outage_lines(caplog)] == [logging.WARNING, logging.INFO]


def test_reports_without_a_group_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    producer = ScriptedProducer()
    caplog.set_level(logging.INFO, logger="ackgate")
    producer.upstream_lost(ADDRESS, "down")
    producer.upstream_back()
    assert outage_lines(caplog) == []
