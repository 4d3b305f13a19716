"""The public conformance kit over KafkaStreamProducer and a real Kafka broker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from ackgate.testing.brokers import KafkaBroker
from ackgate.testing.conformance import LANES, BrokerHarness, ConformanceSuite
from ackgate.testing.resources import KafkaFresh
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster


class KafkaHarness(BrokerHarness):
    """One partition per lane; rejects go to ``dlq_topic``."""

    def __init__(self, fresh: KafkaFresh) -> None:
        self.fresh = fresh
        self.kafka = KafkaTestCluster(fresh.bootstrap)
        self.topic = self.dlq = ""
        self.group = fresh.group()

    async def setup(self) -> None:
        self.topic = await self.fresh.topic(partitions=len(LANES))
        self.dlq = await self.fresh.topic()

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


class TestKafkaConformance(ConformanceSuite):
    @pytest.fixture
    def harness(self, ackgate_kafka: KafkaBroker) -> KafkaHarness:
        return KafkaHarness(KafkaFresh(ackgate_kafka))
