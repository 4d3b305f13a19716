"""docs/production.md#service-options supervision: a group that ends is restarted after a capped
exponential backoff and nothing is lost across it; a handler force-failed by the ack timeout is
subscribed again at once."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from ackgate import AdvanceItem, Message, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing import FakeClock


class CommitFailsOnce(MemoryStreamProducer):
    """The first advance past offset 5 of a partition raises, as a lost broker would."""

    failed = False

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if not CommitFailsOnce.failed and any(i.broker_payload.offset >= 5 for i in batch):
            CommitFailsOnce.failed = True
            raise ConnectionError("commit failed: broker unreachable")
        await super().advance(batch)


async def test_the_group_restarts_after_advance_raises_and_nothing_is_lost(
    broker: MemoryBroker,
    publish: Callable[..., list[Any]],
    running: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(200)
    CommitFailsOnce.failed = False
    service = Service(
        "orders",
        producer=lambda: CommitFailsOnce(broker, "orders", "svc"),
        restart_backoff=0.01,
    )
    handled: dict[str, set[bytes]] = {"indexer": set(), "auditor": set()}
    for handler_id, seen in handled.items():

        async def handle(message: Message, seen: set[bytes] = seen) -> None:
            seen.add(message.body)

        service.handler(handler_id, concurrency=4)(handle)

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await broker.wait_drained("orders", "svc")
    assert CommitFailsOnce.failed
    assert service.stats().restarts == 1
    assert "AdvanceFailed" in caplog.text and "broker unreachable" in caplog.text
    everything = {b"m%d" % n for n in range(200)}
    assert handled["indexer"] == handled["auditor"] == everything
    assert broker.records("orders.dlq") == []


async def test_restart_backoff_doubles_up_to_its_cap_and_resets_after_progress(
    broker: MemoryBroker,
    publish: Callable[..., list[Any]],
    running: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(4)
    failures = 5

    class Unreachable(MemoryStreamProducer):
        """The first five streams fail as they open, as a broker that is down."""

        async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
            nonlocal failures
            if failures:
                failures -= 1
                raise OSError("cannot reach the broker")
            async for item in super().open_stream():
                yield item

    service = Service(
        "orders",
        producer=lambda: Unreachable(broker, "orders", "svc"),
        restart_backoff=0.001,
        max_restart_backoff=0.004,
    )

    @service.handler("h")
    async def handle(message: Message) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await broker.wait_drained("orders", "svc")
    delays = re.findall(r"restarting in (\S+)s", caplog.text)
    assert delays == ["0.001", "0.002", "0.004", "0.004", "0.004"]
    assert "cannot reach the broker" in caplog.text
    assert service.stats().restarts == 5


async def test_a_handler_force_failed_by_the_ack_timeout_is_subscribed_again_at_once(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
) -> None:
    publish(12)
    clock = FakeClock()
    service = Service("orders", producer=memory_producer, ack_timeout=10.0, clock=clock)
    hung = asyncio.Event()
    cancelled = asyncio.Event()
    stuck_on: list[str] = []
    handled: dict[str, set[bytes]] = {"stuck": set(), "other": set()}

    @service.handler("stuck")
    async def stuck(message: Message) -> None:
        if not stuck_on:
            stuck_on.append(message.id)
            hung.set()
            try:
                await asyncio.Event().wait()  # never returns: only the timeout ends it
            except asyncio.CancelledError:
                cancelled.set()
                raise
        handled["stuck"].add(message.body)

    @service.handler("other", concurrency=4)
    async def other(message: Message) -> None:
        handled["other"].add(message.body)

    async with running(service):
        await hung.wait()
        clock.advance(11.0)  # docs/testing.md#fakeclock: the ack timeout fires now
        await cancelled.wait()  # the stuck call is cancelled ...
        await broker.wait_drained("orders", "svc")  # ... and the message redelivered
    assert service.stats().restarts == 0  # the group never ended
    assert handled["stuck"] == handled["other"] == {b"m%d" % n for n in range(12)}


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConnectionError("Kafka could not join: cannot reach the cluster"), None),
        (socket.gaierror(-2, "Name or service not known"), "unknown host: "),
    ],
)
async def test_a_failed_connection_is_one_warning_naming_its_cause_once(
    error: OSError, expected: str | None, running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from ackgate.testing import ScriptedProducer

    made: list[ScriptedProducer] = []
    third = asyncio.Event()  # two restarts logged by then

    def make() -> ScriptedProducer:
        producer = ScriptedProducer()
        producer.fail(error)
        made.append(producer)
        if len(made) == 3:
            third.set()
        return producer

    service = Service("k", producer=make, restart_backoff=0.01)

    @service.handler("h")
    async def handle(message: Message) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await third.wait()
    lines = [r.getMessage() for r in caplog.records if "the group ended" in r.getMessage()]
    assert len(lines) >= 2
    for line in lines:
        assert line.count(str(error.args[-1])) == 1, line
        if expected is not None:
            assert expected in line
