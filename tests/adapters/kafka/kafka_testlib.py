"""Async helpers over the test broker, shared by the Kafka adapter tests and scripts."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class KafkaTestCluster:
    """Small async helpers over the test broker; every test names its own topics."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    @staticmethod
    def unique(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    async def create_topic(self, name: str, partitions: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()

    async def produce(self, topic: str, count: int, partitions: int) -> None:
        """Write ``count`` messages, value ``b"<n>"``, round-robin over the partitions."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        await producer.start()
        try:
            futures = [
                await producer.send(topic, str(n).encode(), partition=n % partitions)
                for n in range(count)
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    async def end_offsets(self, topic: str, partitions: int) -> dict[TopicPartition, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
            return ends
        finally:
            await consumer.stop()

    async def committed(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed offsets; none while a fresh broker has no coordinator
        for the group yet (callers poll)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            return {}
        finally:
            await admin.close()
        return {tp: meta.offset for tp, meta in offsets.items()}

    async def committed_metadata(self, group: str, tp: TopicPartition) -> tuple[int, str] | None:
        """``(offset, metadata)`` of ``tp``'s commit; ``None`` before the first one, or
        while a fresh broker has no coordinator for the group yet."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            found = (await admin.list_consumer_group_offsets(group)).get(tp)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            return None
        finally:
            await admin.close()
        if found is None or found.offset < 0:
            return None
        return found.offset, found.metadata

    async def wait_committed_to_end(
        self, group: str, topic: str, partitions: int
    ) -> dict[TopicPartition, int]:
        """Poll the group's committed offsets until they equal the end offsets.

        The broker offers nothing to await, so this polls; callers bound it with
        ``asyncio.timeout``.
        """
        ends = await self.end_offsets(topic, partitions)
        while True:
            try:
                committed = await self.committed(group)
            except KafkaError as exc:
                # A fresh broker answers "coordinator not available" for a while.
                if not exc.retriable:
                    raise
                committed = {}
            if all(committed.get(tp) == end for tp, end in ends.items()):
                return committed
            await asyncio.sleep(0.2)

    async def read_all(self, topic: str, expected: int) -> list[Any]:
        """Read ``topic`` from the start until ``expected`` records arrived (bounded: 30 s)."""
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        records: list[Any] = []
        try:
            async with asyncio.timeout(30):
                while len(records) < expected:
                    for batch in (await consumer.getmany(timeout_ms=500)).values():
                        records.extend(batch)
            return records
        finally:
            await consumer.stop()

    async def produce_bodies(self, topic: str, bodies: list[bytes]) -> None:
        """Write ``bodies`` in order, each acknowledged."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            for body in bodies:
                await producer.send_and_wait(topic, body)
        finally:
            await producer.stop()
