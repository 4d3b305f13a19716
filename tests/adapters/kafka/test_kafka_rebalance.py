"""A second consumer joins the group mid-stream and leaves again: nothing lost, no stray commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from ackgate import EventBatch, SharedStreamManager, Subscription
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster

FAST_GROUP: dict[str, Any] = {"heartbeat_interval_ms": 300, "session_timeout_ms": 6000}


class CheckedProducer(KafkaStreamProducer):
    """Records every commit and checks it against aiokafka's own view of the assignment.

    A commit is legitimate only for a partition aiokafka has assigned to this consumer,
    and, while a reassignment is in progress, only from inside the revoke callback
    (the drain). White-box: wraps the producer's consumer and revoke hook.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commits: list[tuple[str, int, int]] = []
        self.violations: list[str] = []
        self.revokes = 0
        self._in_revoke = False

    async def open_stream_batches(self) -> AsyncGenerator[EventBatch, None]:
        stream = super().open_stream_batches()  # what the group reads
        try:
            first = await anext(stream)
            self._wrap_commit()
            yield first
            async for item in stream:
                yield item
        finally:
            await stream.aclose()

    async def _on_revoked(self, revoked: Any) -> None:
        revoked = set(revoked)
        self._in_revoke = True
        try:
            await super()._on_revoked(revoked)
        finally:
            self._in_revoke = False
            self.revokes += bool(revoked)

    def _wrap_commit(self) -> None:
        consumer = self._consumer
        real = consumer.commit

        async def commit(offsets: dict[Any, tuple[int, str]]) -> None:
            rebalancing = consumer._subscription.reassignment_in_progress
            for tp, (offset, _) in offsets.items():
                if tp not in consumer.assignment() or (rebalancing and not self._in_revoke):
                    self.violations.append(f"{tp.topic}-{tp.partition}@{offset}")
                self.commits.append((tp.topic, tp.partition, offset))
            await real(offsets)

        consumer.commit = commit


async def consume(
    sub: Subscription, sink: list[tuple[int, int]], seen: asyncio.Event, threshold: int
) -> None:
    """Record every event; set ``seen`` after ``threshold`` of them."""
    async with sub:
        async for record in sub:
            await asyncio.sleep(0.001)  # simulated work, so the stream is long enough to join
            sink.append((record.partition, record.offset))
            if len(sink) >= threshold:
                seen.set()


async def consume_then_leave(sub: Subscription, sink: list[tuple[int, int]], count: int) -> None:
    """Record ``count`` events, then leave cleanly (done with the current one)."""
    async with sub:
        async for record in sub:
            await asyncio.sleep(0.001)
            sink.append((record.partition, record.offset))
            if len(sink) >= count:
                return


async def test_consumer_joins_and_leaves_mid_stream(kafka: KafkaTestCluster) -> None:
    topic, group = kafka.unique("rebalance"), kafka.unique("g")
    # Enough that the second consumer still finds 200 records on its partitions
    # whenever the rebalance completes (the first reads on at ~1,000 records/s).
    partitions, count = 4, 12_000
    await kafka.create_topic(topic, partitions)
    await kafka.produce(topic, count, partitions)
    producers: list[CheckedProducer] = []

    def make() -> CheckedProducer:
        producer = CheckedProducer(
            topic,
            bootstrap_servers=kafka.bootstrap,
            group_id=group,
            rebalance_drain_timeout=2.0,
            **FAST_GROUP,
        )
        producers.append(producer)
        return producer

    first_sink: list[tuple[int, int]] = []
    second_sink: list[tuple[int, int]] = []
    first_going = asyncio.Event()
    async with SharedStreamManager(cohort_grace_period=0.1, overflow="block") as first:
        task = asyncio.create_task(
            consume(first.subscribe(topic, "svc", producer=make), first_sink, first_going, 400)
        )
        try:
            async with asyncio.timeout(60):
                await first_going.wait()
            async with SharedStreamManager(overflow="block") as second, asyncio.timeout(60):
                sub = second.subscribe(topic, "svc", producer=make)
                await consume_then_leave(sub, second_sink, 200)
            # The second consumer left the group; the first takes everything back.
            async with asyncio.timeout(120):
                await kafka.wait_committed_to_end(group, topic, partitions)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    assert len(producers) == 2
    assert producers[0].revokes >= 2, "the first consumer should have rebalanced twice"
    for producer in producers:
        assert producer.violations == []
    assert producers[1].commits, "the second consumer should have committed its share"
    expected = {(n % partitions, n // partitions) for n in range(count)}
    assert set(first_sink) | set(second_sink) == expected
