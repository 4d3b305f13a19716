"""The public conformance kit over SqsStreamProducer and a real SQS server.

The container path runs ElasticMQ, whose FIFO queues hand a message group out again
in order after a redelivery, as SQS does. moto (the local path) reorders a group only
when a visibility timeout expires; the adapter releases a failed message with
visibility 0, so the order-after-redelivery check holds on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from ackgate.testing.brokers import SqsBroker
from ackgate.testing.conformance import BrokerHarness, ConformanceSuite
from ackgate.testing.resources import SqsFresh
from ackgate_sqs import SqsStreamProducer

from .sqs_support import SqsAdmin


class SqsHarness(BrokerHarness):
    """A FIFO queue, one message group per lane; rejects go to ``dlq_queue_url`` (FIFO)."""

    def __init__(self, fresh: SqsFresh) -> None:
        self.fresh = fresh
        self.url = self.dlq_url = ""
        self._client: Any = None
        self.sqs: SqsAdmin

    async def setup(self) -> None:
        self.dlq_url = await self.fresh.queue(fifo=True)
        self.url = await self.fresh.queue(fifo=True)
        self._client = self.fresh.client()
        self.sqs = SqsAdmin(await self._client.__aenter__(), self.fresh.endpoint_url)

    async def teardown(self) -> None:
        if self._client is not None:
            await self._client.__aexit__(None, None, None)

    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        for lane, body in messages:
            await self.sqs.send(self.url, [body], group=lane)

    def producer(self) -> SqsStreamProducer:
        # A short long poll keeps group shutdown quick: closing waits for a poll in flight.
        return SqsStreamProducer(
            self.url,
            region_name=self.fresh.broker.region_name,
            endpoint_url=self.fresh.endpoint_url,
            wait_time_seconds=1,
            dlq_queue_url=self.dlq_url,
        )

    def body(self, raw: Any) -> str:
        return str(raw["Body"])

    async def wait_fully_advanced(self) -> None:
        # SQS offers nothing to await: poll the queue's depth (in flight included).
        while True:
            if await self.sqs.depth(self.url) == 0:
                return
            await asyncio.sleep(0.1)

    async def unadvanced(self) -> int:
        return await self.sqs.depth(self.url)

    async def dead_lettered(self, count: int) -> list[str]:
        dead: list[dict[str, Any]] = []
        while len(dead) < count:
            dead.extend(await self.sqs.drain(self.dlq_url, wait=1))
        return [str(message["Body"]) for message in dead]


class TestSqsConformance(ConformanceSuite):
    @pytest.fixture
    def harness(self, ackgate_sqs: SqsBroker) -> SqsHarness:
        return SqsHarness(SqsFresh(ackgate_sqs))
