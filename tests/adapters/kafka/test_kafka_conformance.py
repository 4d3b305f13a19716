"""The shared conformance suite over KafkaStreamProducer and the real Kafka broker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from ackgate_kafka import KafkaStreamProducer
from ackgate_test_support.conformance import (
    LANES,
    BrokerHarness,
    check_failed_is_redelivered,
    check_nothing_lost,
    check_order_per_lane,
    check_reject_goes_to_dlq,
)

from .kafka_testlib import KafkaTestCluster


class KafkaHarness(BrokerHarness):
    """One partition per lane; rejects go to ``dlq_topic``."""

    def __init__(self, kafka: KafkaTestCluster) -> None:
        self.kafka = kafka
        self.topic = kafka.unique("conformance")
        self.dlq = kafka.unique("conformance-dlq")
        self.group = kafka.unique("g")

    async def create(self) -> None:
        await self.kafka.create_topic(self.topic, len(LANES))
        await self.kafka.create_topic(self.dlq, 1)

    async def publish(self, messages: Sequence[tuple[str, str]]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.kafka.bootstrap, acks="all")
        await producer.start()
        try:
            for lane, body in messages:
                await producer.send_and_wait(self.topic, body.encode(), partition=LANES.index(lane))
        finally:
            await producer.stop()

    def producer(self) -> KafkaStreamProducer:
        return KafkaStreamProducer(
            self.topic,
            bootstrap_servers=self.kafka.bootstrap,
            group_id=self.group,
            dlq_topic=self.dlq,
        )

    def body(self, raw: Any) -> str:
        return bytes(raw.value).decode()

    async def wait_fully_advanced(self) -> None:
        await self.kafka.wait_committed_to_end(self.group, self.topic, len(LANES))

    async def unadvanced(self) -> int:
        ends = await self.kafka.end_offsets(self.topic, len(LANES))
        committed = await self.kafka.committed(self.group)
        return sum(end - committed.get(tp, 0) for tp, end in ends.items())

    async def dead_lettered(self, count: int) -> list[str]:
        return [
            bytes(record.value).decode() for record in await self.kafka.read_all(self.dlq, count)
        ]


@pytest.fixture
async def harness(kafka: KafkaTestCluster) -> KafkaHarness:
    harness = KafkaHarness(kafka)
    await harness.create()
    return harness


async def test_nothing_lost(harness: KafkaHarness) -> None:
    await check_nothing_lost(harness)


async def test_order_per_lane(harness: KafkaHarness) -> None:
    await check_order_per_lane(harness)


async def test_reject_goes_to_dlq(harness: KafkaHarness) -> None:
    await check_reject_goes_to_dlq(harness)


async def test_failed_is_redelivered(harness: KafkaHarness) -> None:
    await check_failed_is_redelivered(harness)
