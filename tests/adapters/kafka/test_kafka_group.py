"""ackgate groups over KafkaStreamProducer against the real broker: fan-out, DLQ, redelivery."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from ackgate import (
    SharedStreamManager,
    StreamTerminated,
    Subscription,
    reject_shared_stream_event,
)
from ackgate_kafka import KafkaStreamProducer
from ackgate_test_support.reject_reasons import REASONS, reject_with_reasons

from .kafka_testlib import KafkaTestCluster, free_port


class Crash(Exception):
    """A handler blowing up mid-event."""


async def drain_into(sub: Subscription, sink: list[int]) -> None:
    async with sub:
        async for record in sub:
            sink.append(int(record.value))


async def stop(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel subscribers blocked on their next pull (no window open, nothing fails)."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


async def test_every_message_reaches_every_subscriber_and_commits_to_end(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("fanout"), kafka.unique("g")
    partitions, count = 3, 20_000
    await kafka.create_topic(topic, partitions)
    await kafka.produce(topic, count, partitions)
    sinks: dict[str, list[int]] = {f"sub-{i}": [] for i in range(4)}

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)

    async with SharedStreamManager(cohort_grace_period=0.2) as manager:
        subs = {sid: manager.subscribe(topic, sid, producer=make) for sid in sinks}
        tasks = [asyncio.create_task(drain_into(subs[sid], sinks[sid])) for sid in sinks]
        try:
            async with asyncio.timeout(180):
                committed = await kafka.wait_committed_to_end(group, topic, partitions)
        finally:
            await stop(tasks)

    assert sum(committed.values()) == count
    for sid, sink in sinks.items():
        assert len(sink) == count, sid
        assert set(sink) == set(range(count)), sid


async def test_rejects_land_in_dlq_and_failed_event_is_redelivered(
    kafka: KafkaTestCluster,
) -> None:
    topic, dlq, group = kafka.unique("dlq-src"), kafka.unique("dlq"), kafka.unique("g")
    partitions, count, crash_at = 2, 400, 201
    await kafka.create_topic(topic, partitions)
    await kafka.create_topic(dlq, 1)
    await kafka.produce(topic, count, partitions)
    rejected = {n for n in range(count) if n % 50 == 7}
    plain: list[int] = []
    picky: list[int] = []
    crasher: list[int] = []

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic, bootstrap_servers=kafka.bootstrap, group_id=group, dlq_topic=dlq
        )

    async def reject_some(sub: Subscription) -> None:
        async with sub:
            async for record in sub:
                picky.append(int(record.value))
                if int(record.value) in rejected:
                    reject_shared_stream_event()

    async def crash_once() -> None:
        crashed = False
        while True:
            try:
                async with manager.subscribe(topic, "crasher", producer=make) as sub:
                    async for record in sub:
                        crasher.append(int(record.value))
                        if int(record.value) == crash_at and not crashed:
                            crashed = True
                            raise Crash
            except Crash:
                continue

    async with SharedStreamManager(cohort_grace_period=0.2) as manager:
        tasks = [
            asyncio.create_task(
                drain_into(manager.subscribe(topic, "plain", producer=make), plain)
            ),
            asyncio.create_task(reject_some(manager.subscribe(topic, "picky", producer=make))),
            asyncio.create_task(crash_once()),
        ]
        try:
            async with asyncio.timeout(120):
                await kafka.wait_committed_to_end(group, topic, partitions)
        finally:
            await stop(tasks)

    # Nothing lost for the subscribers that never left; the failed event came back to
    # the crasher only: the others had acked it (docs/concepts.md#redelivery-memory, get_event_id).
    assert set(plain) == set(picky) == set(range(count))
    assert Counter(crasher)[crash_at] >= 2
    assert Counter(plain)[crash_at] == Counter(picky)[crash_at] == 1
    dead = await kafka.read_all(dlq, len(rejected))
    assert {int(record.value) for record in dead} == rejected
    for record in dead:
        headers = dict(record.headers)
        n = int(record.value)
        assert headers["ackgate.original.topic"] == topic.encode()
        assert headers["ackgate.original.partition"] == str(n % partitions).encode()
        assert headers["ackgate.original.offset"] == str(n // partitions).encode()
        assert headers["ackgate.reason"].startswith(b"rejected by 1 of ")


async def test_the_dlq_reason_header_names_the_rejecting_subscribers_in_subscription_order(
    kafka: KafkaTestCluster,
) -> None:
    topic, dlq, group = kafka.unique("reasons"), kafka.unique("dlq"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.create_topic(dlq, 1)
    await kafka.produce(topic, 1, 1)

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic, bootstrap_servers=kafka.bootstrap, group_id=group, dlq_topic=dlq
        )

    async with asyncio.timeout(60):
        raw = await reject_with_reasons(topic, make)
    assert (raw.partition, raw.offset, raw.value) == (0, 0, b"0")
    [dead] = await kafka.read_all(dlq, 1)
    assert dead.value == b"0"
    assert dict(dead.headers) == {
        "ackgate.original.topic": topic.encode(),
        "ackgate.original.partition": b"0",
        "ackgate.original.offset": b"0",
        "ackgate.reason": b"rejected by 2 of 3 subscribers: "
        b"auditor: schema v3 unsupported; parser: bad json",
    }
    assert dict(dead.headers)["ackgate.reason"].endswith("; ".join(REASONS).encode())
    assert await kafka.committed(group) == {TopicPartition(topic, 0): 1}


async def test_bad_bootstrap_ends_the_group_with_a_clear_cause() -> None:
    servers = f"127.0.0.1:{free_port()}"

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer("t", bootstrap_servers=servers, group_id="g")

    async with (
        SharedStreamManager() as manager,
        manager.subscribe("bad", "s", producer=make) as sub,
    ):
        with pytest.raises(StreamTerminated) as info:
            async with asyncio.timeout(60):
                async for _ in sub:
                    pass
    cause = info.value.__cause__
    assert isinstance(cause, ConnectionError)
    assert servers in str(cause)
