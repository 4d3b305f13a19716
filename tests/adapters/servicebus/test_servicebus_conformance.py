"""The public conformance kit over ServiceBusStreamProducer and the fake Service Bus.

No Service Bus broker runs here; the fake stands at the SDK's client interface, so
the adapter's own code runs unchanged (see ``fake_servicebus``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ackgate.testing.conformance import BrokerHarness, ConformanceSuite
from ackgate_servicebus import NEXT_AVAILABLE_SESSION, ServiceBusStreamProducer

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


class TestServiceBusConformance(ConformanceSuite):
    @pytest.fixture
    def harness(self) -> ServiceBusHarness:
        return ServiceBusHarness()
