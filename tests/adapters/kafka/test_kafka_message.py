"""to_message (docs/production.md#service-options) and get_event_id
(docs/concepts.md#redelivery-memory) on records fetched from the real broker."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import pickle
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from ackgate import EventBatch, Message
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
    assert message.attempt == tombstone.attempt == 1
    assert message.raw is first
    assert (tombstone.body, tombstone.key, tombstone.id) == (b"", b"gone", f"{topic}/1/1")
    assert tombstone.raw.value is None
    assert event_ids == [(topic, 1, 0), (topic, 1, 1)]


async def test_partition_batches_carry_the_same_events_as_the_stream(
    kafka: KafkaTestCluster,
) -> None:
    """``open_stream_batches`` (what a group reads): one EventBatch per partition of a
    fetch, whose lane, ids and messages are what the per-event methods give."""
    topic, group = kafka.unique("batches"), kafka.unique("g")
    await kafka.create_topic(topic, 2)
    sender = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await sender.start()
    try:
        for n in range(10):
            await sender.send_and_wait(topic, b"v%d" % n, partition=n % 2)
    finally:
        await sender.stop()

    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    batches = producer.open_stream_batches()
    got: dict[int, list[int]] = {0: [], 1: []}
    try:
        async with asyncio.timeout(30):
            while sum(map(len, got.values())) < 10:
                batch = await anext(batches)
                assert isinstance(batch, EventBatch)
                partition = batch.lane.partition
                for record, delivery, event_id, message in zip(
                    batch.raw_events,
                    batch.broker_payloads,
                    batch.event_ids or (),
                    producer.to_messages(batch),
                    strict=True,
                ):
                    assert producer.get_advance_lane(delivery) == batch.lane
                    assert producer.get_event_id(delivery) == event_id
                    assert message == producer.to_message(record, delivery)
                    assert (message.body, message.lane) == (record.value, batch.lane)
                    got[partition].append(record.offset)
    finally:
        await batches.aclose()
        await producer.aclose()
    assert got == {0: [0, 1, 2, 3, 4], 1: [0, 1, 2, 3, 4]}


class _Record:
    topic, partition, offset = "t", 3, 7
    key = b"k"
    value = b"body"
    headers = (("h", b"1"),)


def test_a_record_message_is_a_frozen_message_and_copies_as_a_plain_one() -> None:
    producer = KafkaStreamProducer("t", bootstrap_servers="unused:9092", group_id="g")
    delivery = SimpleNamespace(tp=TopicPartition("t", 3), attempt=1)
    message = producer.to_message(_Record(), delivery)
    assert isinstance(message, Message)
    assert message.headers is message.headers  # built once
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.body = b"other"  # type: ignore[misc]
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    plain = Message(**fields)
    for copied in (copy.copy(message), pickle.loads(pickle.dumps(message))):
        assert type(copied) is Message
        assert {f: getattr(copied, f) for f in fields if f != "raw"} == {
            f: v for f, v in fields.items() if f != "raw"
        }
    changed = dataclasses.replace(message, body=b"new")
    assert type(changed) is Message and changed.body == b"new" and changed.id == "t/3/7"
    assert repr(message) == repr(plain)


def test_a_record_message_decodes_once_into_a_plain_copy() -> None:
    """decode= (docs/getting-started.md#typed-payloads) on the adapter's own Message
    subclass: the copy is a plain Message with the value, the record's fields kept."""
    from ackgate._service.decode import check_decoder

    producer = KafkaStreamProducer("t", bootstrap_servers="unused:9092", group_id="g")
    delivery = SimpleNamespace(tp=TopicPartition("t", 3), attempt=1)
    message = producer.to_message(_Record(), delivery)
    assert message.value is None
    calls: list[bytes] = []
    decoder = check_decoder("h", lambda body: calls.append(body) or body.upper())
    assert decoder is not None
    for _ in range(2):
        copied = decoder.decoded(message)
        assert type(copied) is Message and copied.value == b"BODY"
        assert (copied.id, copied.key, copied.headers) == ("t/3/7", b"k", {"h": b"1"})
    assert calls == [b"body"]


def test_a_value_that_is_not_bytes_is_refused() -> None:
    producer = KafkaStreamProducer("t", bootstrap_servers="unused:9092", group_id="g")
    record = _Record()
    record.value = "text"  # type: ignore[assignment]
    delivery = SimpleNamespace(tp=TopicPartition("t", 3), attempt=1)
    with pytest.raises(TypeError, match="needs bytes values"):
        producer.to_message(record, delivery)
    with pytest.raises(TypeError, match="needs bytes values"):
        producer.to_messages(EventBatch([record], [delivery], delivery.tp))
