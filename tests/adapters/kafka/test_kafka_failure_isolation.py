"""A failure costs only its handler and its key, on genuine Kafka
(docs/failure-semantics.md#redelivery-to-the-failing-handler), and the DLQ takes each rejected
record once, a stub for one too large, and refuses for good without a restart loop.

The issue's scenario 1 at a tenth of its size: ``store`` (concurrency 16, ordering by key),
``audit`` (batches) and ``notify`` (ordering by key, ``give_up_after=3``, failing 1 %
of the messages every time); ``store`` rejects another 1 %. The speed figures are
``benchmarks/failure_isolation.py``'s; this checks what must hold whatever the speed."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, defaultdict
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from ackgate import Message, PermanentError, Redelivery, Reject, Service
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster

COUNT = 2_000
KEYS = 41
PARTITIONS = 4


def poison(n: int) -> bool:
    return n % 100 == 7  # notify fails these every time: 20 messages


def torn(n: int) -> bool:
    return n % 100 == 53  # store rejects these: 20 more


async def produce_keyed(kafka: KafkaTestCluster, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, str(n).encode(), key=b"k%d" % (n % KEYS))
            for n in range(COUNT)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def in_key_order(calls: list[int]) -> bool:
    """Calls of one key: increasing, a message repeated only right after itself."""
    distinct = [n for index, n in enumerate(calls) if index == 0 or calls[index - 1] != n]
    return distinct == sorted(set(distinct))


async def test_a_failing_handler_costs_only_itself_and_each_reject_is_dead_lettered_once(
    kafka: KafkaTestCluster,
) -> None:
    topic, dlq, group = kafka.unique("iso"), kafka.unique("iso-dlq"), kafka.unique("g")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.create_topic(dlq, 1)
    await produce_keyed(kafka, topic)
    service = Service(
        "iso",
        producer=lambda: KafkaStreamProducer(
            topic, bootstrap_servers=kafka.bootstrap, group_id=group, dlq_topic=dlq
        ),
        redelivery=Redelivery(backoff=0.05, max_backoff=0.1),
    )
    stored: dict[bytes, list[int]] = defaultdict(list)
    notified: dict[bytes, list[int]] = defaultdict(list)
    audited: Counter[int] = Counter()
    attempts: dict[int, list[int | None]] = defaultdict(list)

    @service.handler("store", concurrency=16, ordering="key")
    async def store(message: Message) -> None:
        n = int(message.body)
        assert message.key is not None
        stored[message.key].append(n)
        if torn(n):
            raise Reject("torn row")

    @service.handler("audit", batch_size=100, batch_wait=0.01)
    async def audit(messages: list[Message]) -> None:
        audited.update(int(m.body) for m in messages)

    @service.handler("notify", ordering="key", give_up_after=3)
    async def notify(message: Message) -> None:
        n = int(message.body)
        assert message.key is not None
        notified[message.key].append(n)
        if poison(n):
            attempts[n].append(message.attempt)
            raise ConnectionError("mail server refused it")

    async with asyncio.timeout(120):
        running = asyncio.create_task(service.run())
        await kafka.wait_committed_to_end(group, topic, PARTITIONS)
        await service.stop()
        await running
    everything = set(range(COUNT))
    # The healthy handlers finished every message, each once (the partition was never
    # rewound for them), in key order.
    assert audited == Counter(everything)
    assert sorted(n for calls in stored.values() for n in calls) == sorted(everything)
    assert all(calls == sorted(calls) for calls in stored.values())
    # notify: every poison message called exactly 3 times, attempts 1, 2, 3; the rest
    # once; its key's later messages after it.
    poisoned = {n for n in everything if poison(n)}
    assert attempts == {n: [1, 2, 3] for n in poisoned}
    calls = Counter(n for each in notified.values() for n in each)
    assert calls == Counter({n: 3 if n in poisoned else 1 for n in everything})
    assert all(in_key_order(each) for each in notified.values())
    # Each rejected record in the DLQ exactly once: the poison (given up by notify) and
    # the torn ones (rejected by store).
    expected = sorted(n for n in everything if poison(n) or torn(n))
    letters = await kafka.read_all(dlq, len(expected))
    assert sorted(int(record.value) for record in letters) == expected
    stats = service.stats()
    assert stats.restarts == 0
    assert (stats.handlers["notify"].gave_up, stats.handlers["notify"].failed) == (20, 40)


async def test_a_record_too_large_for_the_dlq_is_dead_lettered_as_a_stub(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic, dlq, group = kafka.unique("big"), kafka.unique("big-dlq"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.create_topic(dlq, 1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, max_request_size=200_000)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"x" * 50_000)
        await producer.send_and_wait(topic, b"small")
    finally:
        await producer.stop()
    service = Service(
        "big",
        producer=lambda: KafkaStreamProducer(
            topic,
            bootstrap_servers=kafka.bootstrap,
            group_id=group,
            dlq_topic=dlq,
            dlq_producer_options={"max_request_size": 10_000},
        ),
    )

    @service.handler("h")
    async def h(message: Message) -> None:
        if len(message.body) > 1000:
            raise Reject("too big to index")

    with caplog.at_level(logging.ERROR, logger="ackgate.adapters.kafka"):
        async with asyncio.timeout(60):
            running = asyncio.create_task(service.run())
            await kafka.wait_committed_to_end(group, topic, 1)
            await service.stop()
            await running
    (letter,) = await kafka.read_all(dlq, 1)
    stub: dict[str, Any] = json.loads(letter.value)
    assert (stub["topic"], stub["partition"], stub["offset"]) == (topic, 0, 0)
    assert stub["size"] == 50_000
    assert stub["reason"] == "rejected by 1 of 1 subscribers: h: too big to index"
    headers = dict(letter.headers)
    assert headers["ackgate.original.offset"] == b"0" and headers["ackgate.stub"] == b"50000"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "max_request_size" in errors[0]
    assert service.stats().restarts == 0


async def test_a_dlq_topic_refused_for_good_stops_the_service_instead_of_restarting(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("refused"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 1, 1)
    service = Service(
        "refused",
        producer=lambda: KafkaStreamProducer(
            topic,
            bootstrap_servers=kafka.bootstrap,
            group_id=group,
            dlq_topic="no/such topic",  # not a valid topic name: never created
            dlq_producer_options={"request_timeout_ms": 2_000},
        ),
        restart_backoff=0.0,
    )

    @service.handler("h")
    async def h(message: Message) -> None:
        raise Reject("unwanted")

    with pytest.raises(PermanentError, match="refuses writes for good"):
        async with asyncio.timeout(60):
            await service.run()
    assert service.stats().restarts == 0
    # Never committed past it (the offset map's commits stay at offset 0).
    assert all(offset <= 0 for offset in (await kafka.committed(group)).values())


def test_dlq_producer_options_need_a_dlq_topic_and_a_mapping() -> None:
    with pytest.raises(ValueError, match="dlq_producer_options apply to the DLQ producer"):
        KafkaStreamProducer(
            "t", bootstrap_servers="x:1", group_id="g", dlq_producer_options={"acks": 1}
        )
    with pytest.raises(TypeError, match="dlq_producer_options must be a mapping"):
        KafkaStreamProducer(
            "t",
            bootstrap_servers="x:1",
            group_id="g",
            dlq_topic="d",
            dlq_producer_options=[("acks", 1)],  # type: ignore[arg-type]
        )
