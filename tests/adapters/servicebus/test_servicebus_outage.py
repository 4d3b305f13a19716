"""docs/failure-semantics.md#broker-outages on Service Bus (the fake broker): the namespace cannot
be reached for a while; the service recovers by itself once it can.

A receive that cannot reach the namespace ends the group (the adapter's choice:
a new client on restart) and supervision starts it again; the outage is logged once
on ``ackgate.upstream`` (one WARNING, one INFO) however many restarts it takes, and
``GroupStats`` shows it while it lasts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
from azure.servicebus.exceptions import ServiceBusConnectionError

from ackgate import Message, Service
from ackgate_servicebus import ServiceBusStreamProducer

from .fake_servicebus import FakeServiceBus


async def until(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """The service runs in this loop but nothing signals these states: poll them."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_service_recovers_when_the_namespace_is_reachable_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ackgate")
    bus = FakeServiceBus()
    bus.create_queue("q")
    bus.send("q", b"before")
    bodies: list[bytes] = []
    service = Service(
        "sb-outage",
        producer=lambda: ServiceBusStreamProducer(
            client_factory=bus.client, queue_name="q", max_wait_time=0.2
        ),
        restart_backoff=0.05,
        max_restart_backoff=0.1,
    )

    @service.handler("collect")
    async def collect(message: Message) -> None:
        bodies.append(message.body)

    def connected() -> bool | None:
        group = service.stats().group
        return None if group is None else group.upstream_connected

    running = asyncio.create_task(service.run())
    await until(lambda: bodies == [b"before"], 10, "the first message")
    bus.unreachable = ServiceBusConnectionError(message="Failed to initiate the connection")
    await until(lambda: connected() is False, 10, "the outage is not shown")
    await until(lambda: service.stats().restarts >= 3, 10, "supervision does not retry")
    # Still the same outage in the restarted groups.
    await until(lambda: connected() is False, 10, "a restarted group forgot the outage")

    bus.unreachable = None
    bus.send("q", b"after")
    await until(lambda: connected() is True, 10, "no recovery")
    await until(lambda: bodies == [b"before", b"after"], 10, "new messages do not flow")
    await service.stop()
    await running

    outage = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ackgate.upstream"]
    assert [level for level, _ in outage] == [logging.WARNING, logging.INFO], outage
    assert "address=<client_factory> queue 'q'" in outage[0][1], outage[0][1]
    assert "ServiceBusConnectionError" in outage[0][1]
