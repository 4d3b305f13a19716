"""to_message (SPEC §12) and get_event_id (§13) on records fetched from the real broker."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from ackgate import Message
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster


async def test_records_convert_to_messages_with_their_identity(kafka: KafkaTestCluster) -> None:
    topic, group = kafka.unique("message"), kafka.unique("g")
    await kafka.create_topic(topic, 2)
    sender = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await sender.start()
    try:
        await sender.send_and_wait(
            topic,
            b"body",
            key=b"k1",
            partition=1,
            headers=[("trace", b"t1"), ("dup", b"first"), ("dup", b"last")],
        )
        await sender.send_and_wait(topic, None, key=b"gone", partition=1)  # a tombstone
    finally:
        await sender.stop()

    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    try:
        async with asyncio.timeout(30):
            (first, first_delivery), (tomb, tomb_delivery) = [await anext(stream) for _ in "ab"]
        message = producer.to_message(first, first_delivery)
        tombstone = producer.to_message(tomb, tomb_delivery)
        event_ids = [producer.get_event_id(d) for d in (first_delivery, tomb_delivery)]
    finally:
        await stream.aclose()
        await producer.aclose()

    assert isinstance(message, Message)
    assert message.body == b"body"
    assert message.key == b"k1"
    assert dict(message.headers) == {"trace": b"t1", "dup": b"last"}
    assert message.id == f"{topic}/1/0"
    assert message.lane == TopicPartition(topic, 1) == producer.get_advance_lane(first_delivery)
    assert message.attempt is None
    assert message.raw is first
    assert (tombstone.body, tombstone.key, tombstone.id) == (b"", b"gone", f"{topic}/1/1")
    assert tombstone.raw.value is None
    assert event_ids == [(topic, 1, 0), (topic, 1, 1)]
