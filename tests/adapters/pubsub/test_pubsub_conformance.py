"""The public conformance kit over PubSubStreamProducer and the Pub/Sub emulator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ackgate.testing.brokers import PubSubBroker
from ackgate.testing.conformance import BrokerHarness, ConformanceSuite
from ackgate.testing.resources import PubSubFresh
from ackgate_pubsub import PubSubStreamProducer

from .pubsub_support import PubSubAdmin, text


class PubSubHarness(BrokerHarness):
    """An ordered subscription, one ordering key per lane; rejects go to ``dlq_topic``."""

    def __init__(self, fresh: PubSubFresh) -> None:
        self.fresh = fresh
        self.topic = self.subscription = self.dlq_topic = self.dlq = ""
        self.pubsub: PubSubAdmin

    async def setup(self) -> None:
        self.topic = await self.fresh.topic()
        self.subscription = await self.fresh.subscription(self.topic, ordering=True)
        self.dlq_topic = await self.fresh.topic()
        self.dlq = await self.fresh.subscription(self.dlq_topic)
        self.pubsub = PubSubAdmin(self.fresh.emulator_host)

    async def teardown(self) -> None:
        await self.pubsub.aclose()

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


class TestPubSubConformance(ConformanceSuite):
    @pytest.fixture
    def harness(self, ackgate_pubsub: PubSubBroker) -> PubSubHarness:
        return PubSubHarness(PubSubFresh(ackgate_pubsub))
