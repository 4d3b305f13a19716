"""The shared conformance suite over ServiceBusStreamProducer and the fake Service Bus.

No Service Bus broker runs here; the fake stands at the SDK's client interface, so
the adapter's own code runs unchanged (see ``fake_servicebus``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ackgate_servicebus import NEXT_AVAILABLE_SESSION, ServiceBusStreamProducer
from ackgate_test_support.conformance import (
    BrokerHarness,
    check_failed_is_redelivered,
    check_nothing_lost,
    check_order_per_lane,
    check_reject_goes_to_dlq,
)

from .fake_servicebus import FakeServiceBus

QUEUE = "conformance"


class ServiceBusHarness(BrokerHarness):
    """A session queue, one session per lane, read with ``NEXT_AVAILABLE_SESSION``;
    rejects go to the queue's dead-letter sub-queue."""

    def __init__(self) -> None:
        self.bus = FakeServiceBus(lock_duration=30.0, max_delivery_count=5)
        self.queue = self.bus.create_queue(QUEUE, requires_session=True)

    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        for lane, body in messages:
            self.bus.send(QUEUE, body, session_id=lane)

    def producer(self) -> ServiceBusStreamProducer:
        return ServiceBusStreamProducer(
            client_factory=self.bus.client,
            queue_name=QUEUE,
            session_id=NEXT_AVAILABLE_SESSION,
            max_wait_time=0.05,
        )

    def body(self, raw: Any) -> str:
        return str(raw)

    async def wait_fully_advanced(self) -> None:
        await self.bus.wait_until(lambda: self.queue.active_count() == 0)

    async def unadvanced(self) -> int:
        return self.queue.active_count()

    async def dead_lettered(self, count: int) -> list[str]:
        await self.bus.wait_until(lambda: len(self.queue.dead_lettered) >= count)
        return [stored.body.decode() for stored in self.queue.dead_lettered]


@pytest.fixture
def harness() -> ServiceBusHarness:
    return ServiceBusHarness()


async def test_nothing_lost(harness: ServiceBusHarness) -> None:
    await check_nothing_lost(harness)


async def test_order_per_lane(harness: ServiceBusHarness) -> None:
    await check_order_per_lane(harness)


async def test_reject_goes_to_dlq(harness: ServiceBusHarness) -> None:
    await check_reject_goes_to_dlq(harness)


async def test_failed_is_redelivered(harness: ServiceBusHarness) -> None:
    await check_failed_is_redelivered(harness)
