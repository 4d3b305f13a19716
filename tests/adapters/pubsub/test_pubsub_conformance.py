"""The shared conformance suite over PubSubStreamProducer and the Pub/Sub emulator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ackgate_pubsub import PubSubStreamProducer
from ackgate_test_support.conformance import (
    BrokerHarness,
    check_failed_is_redelivered,
    check_nothing_lost,
    check_order_per_lane,
    check_reject_goes_to_dlq,
)

from .pubsub_support import PubSubAdmin, text


class PubSubHarness(BrokerHarness):
    """An ordered subscription, one ordering key per lane; rejects go to ``dlq_topic``."""

    def __init__(self, pubsub: PubSubAdmin) -> None:
        self.pubsub = pubsub
        self.topic = self.subscription = self.dlq_topic = self.dlq = ""

    async def create(self) -> None:
        self.topic = await self.pubsub.create_topic()
        self.subscription = await self.pubsub.create_subscription(self.topic, ordering=True)
        self.dlq_topic = await self.pubsub.create_topic()
        self.dlq = await self.pubsub.create_subscription(self.dlq_topic)

    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        for lane, body in messages:
            await self.pubsub.publish(self.topic, [body], ordering_key=lane)

    def producer(self) -> PubSubStreamProducer:
        return PubSubStreamProducer(self.subscription, dlq_topic=self.dlq_topic, pull_timeout=2)

    def body(self, raw: Any) -> str:
        return text(raw)

    async def wait_fully_advanced(self) -> None:
        # The emulator has no backlog count; every message acked (AdvanceLog) is the
        # measure, and unadvanced() checks nothing comes back once the group stopped.
        return

    async def unadvanced(self) -> int:
        # aclose() nacked whatever was not settled, so it would be back at once.
        return len(await self.pubsub.pull(self.subscription, wait=2))

    async def dead_lettered(self, count: int) -> list[str]:
        dead: list[str] = []
        while len(dead) < count:
            received = await self.pubsub.pull(self.dlq, wait=5)
            await self.pubsub.ack(self.dlq, received)
            dead.extend(text(message) for message in received)
        return dead


@pytest.fixture
async def harness(pubsub: PubSubAdmin) -> PubSubHarness:
    harness = PubSubHarness(pubsub)
    await harness.create()
    return harness


async def test_nothing_lost(harness: PubSubHarness) -> None:
    await check_nothing_lost(harness)


async def test_order_per_lane(harness: PubSubHarness) -> None:
    await check_order_per_lane(harness)


async def test_reject_goes_to_dlq(harness: PubSubHarness) -> None:
    await check_reject_goes_to_dlq(harness)


async def test_failed_is_redelivered(harness: PubSubHarness) -> None:
    await check_failed_is_redelivered(harness)
