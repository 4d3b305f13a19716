"""The shared conformance suite over SqsStreamProducer and a real SQS server (moto)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from ackgate_sqs import SqsStreamProducer
from ackgate_test_support.conformance import (
    BrokerHarness,
    check_failed_is_redelivered,
    check_nothing_lost,
    check_order_per_lane,
    check_reject_goes_to_dlq,
)

from .sqs_support import REGION, SqsAdmin


class SqsHarness(BrokerHarness):
    """A FIFO queue, one message group per lane; rejects go to ``dlq_queue_url`` (FIFO)."""

    def __init__(self, sqs: SqsAdmin, url: str, dlq_url: str) -> None:
        self.sqs = sqs
        self.url = url
        self.dlq_url = dlq_url

    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        for lane, body in messages:
            await self.sqs.send(self.url, [body], group=lane)

    def producer(self) -> SqsStreamProducer:
        # A short long poll keeps group shutdown quick: closing waits for a poll in flight.
        return SqsStreamProducer(
            self.url,
            region_name=REGION,
            endpoint_url=self.sqs.endpoint,
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


@pytest.fixture
async def harness(sqs: SqsAdmin) -> SqsHarness:
    dlq_url = await sqs.create_queue(fifo=True)
    return SqsHarness(sqs, await sqs.create_queue(fifo=True), dlq_url)


async def test_nothing_lost(harness: SqsHarness) -> None:
    await check_nothing_lost(harness)


async def test_order_per_lane(harness: SqsHarness) -> None:
    await check_order_per_lane(harness)


async def test_reject_goes_to_dlq(harness: SqsHarness) -> None:
    await check_reject_goes_to_dlq(harness)


async def test_failed_is_redelivered(harness: SqsHarness) -> None:
    await check_failed_is_redelivered(harness)
