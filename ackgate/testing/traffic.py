"""Publish test messages to a real broker and wait until a consumer has advanced past them.

The fixtures' fresh resources (:mod:`ackgate.testing.resources`) expose these as
methods (``await ackgate_kafka_fresh.publish(topic, [...])``, ``await
ackgate_kafka_fresh.wait_advanced(topic, group)``, and the same for SQS); the
functions here take the broker's address, for a script or the ``brokers`` command.

A message to publish is ``bytes`` or ``str`` (the body) or an :class:`Outgoing` with a
key and headers. Every wait ends with :class:`StillOutstanding` after ``within``
seconds (``within``), naming what the consumer has not advanced past yet. Each call opens and
closes its own client, so it can be used from any event loop; the broker's SDK is
imported on first use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KafkaRecord",
    "Outgoing",
    "PartitionOffsets",
    "StillOutstanding",
    "kafka_create_topic",
    "kafka_offsets",
    "kafka_publish",
    "kafka_read",
    "kafka_wait_advanced",
    "pubsub_publish",
    "sqs_publish",
    "sqs_wait_drained",
]

#: Seconds between two looks at the broker while waiting.
_POLL = 0.2


@dataclass(frozen=True)
class Outgoing:
    """One message to publish: the body, and optionally a key and headers.

    Attributes:
        body: The message's bytes (a ``str`` is encoded as UTF-8).
        key: Kafka: the record key (it picks the partition). SQS FIFO: the message
            group. Pub/Sub: the ordering key. Ignored by a standard SQS queue.
        headers: Kafka: record headers. SQS: string message attributes. Pub/Sub:
            attributes. (Both UTF-8.)
    """

    body: bytes | str
    key: bytes | str | None = None
    headers: Mapping[str, bytes | str] = field(default_factory=dict)


class StillOutstanding(TimeoutError):
    """A wait timed out; the message says what the consumer had not advanced past."""


def _outgoing(message: bytes | str | Outgoing) -> Outgoing:
    if isinstance(message, Outgoing):
        return message
    if isinstance(message, bytes | str):
        return Outgoing(message)
    raise TypeError(f"a message to publish is bytes, str or Outgoing, not {type(message).__name__}")


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _wait(what: str, outstanding: Callable[[], Awaitable[str | None]], within: float) -> None:
    """Call ``outstanding`` until it returns ``None``; it returns what is left otherwise."""
    deadline = time.monotonic() + within
    while True:
        left = await outstanding()
        if left is None:
            return
        if time.monotonic() >= deadline:
            raise StillOutstanding(f"after {within:g} s, {what}: {left}")
        await asyncio.sleep(_POLL)


# -- Kafka -------------------------------------------------------------------------------


async def kafka_create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    """Create topic ``name`` with ``partitions`` partitions (replication factor 1).

    An existing topic is an error (``TopicAlreadyExistsError``): a topic that Kafka
    auto-created on first use has one partition, whatever the test meant.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    if partitions < 1:
        raise ValueError(f"partitions={partitions}: a topic needs at least one")
    from aiokafka.errors import for_code

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    # The admin client reports a refusal in the response, it does not raise it.
    for topic, code, *message in response.topic_errors:
        if code:
            raise for_code(code)(message[0] if message and message[0] else f"topic {topic!r}")


async def kafka_publish(
    bootstrap: str, topic: str, messages: Iterable[bytes | str | Outgoing]
) -> int:
    """Publish ``messages`` to ``topic`` in order, each acknowledged by the broker;
    return how many. Records with the same key go to the same partition, in order."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    sent = 0
    try:
        for message in map(_outgoing, messages):
            await producer.send_and_wait(
                topic,
                _bytes(message.body),
                key=None if message.key is None else _bytes(message.key),
                headers=[(name, _bytes(value)) for name, value in message.headers.items()],
            )
            sent += 1
    finally:
        await producer.stop()
    return sent


async def kafka_wait_advanced(bootstrap: str, topic: str, group: str, within: float = 30) -> None:
    """Wait until consumer group ``group`` has committed ``topic``'s end offset on every
    partition, i.e. it has advanced past every record published so far.

    A fresh broker answers ``GroupCoordinatorNotAvailableError`` (and other retriable
    errors) until its group coordinator is up: those are retried until ``within`` runs out, and
    the last one is named in :class:`StillOutstanding` if it never came up.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    ends = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    async def outstanding() -> str | None:
        try:
            (described,) = await admin.describe_topics([topic])
            partitions = sorted(p["partition"] for p in described.get("partitions", ()))
            if described.get("error_code") or not partitions:
                return f"topic {topic!r} does not exist (yet)"
            tps = [TopicPartition(topic, p) for p in partitions]
            end = await ends.end_offsets(tps)
            got = await admin.list_consumer_group_offsets(group, partitions=tps)
        except KafkaError as exc:
            if not exc.retriable:  # GroupCoordinatorNotAvailableError is retriable
                raise
            return f"the broker answered {type(exc).__name__} (retried)"
        behind = []
        for tp in tps:
            committed = got[tp].offset if tp in got and got[tp].offset >= 0 else 0
            if committed < end[tp]:
                behind.append(
                    f"partition {tp.partition} committed {committed} of {end[tp]} "
                    f"({end[tp] - committed} outstanding)"
                )
        return "; ".join(behind) or None

    await admin.start()
    try:
        await ends.start()
        try:
            await _wait(f"group {group!r} has not committed all of {topic!r}", outstanding, within)
        finally:
            await ends.stop()
    finally:
        await admin.close()


@dataclass(frozen=True)
class KafkaRecord:
    """One record as :func:`kafka_read` read it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


async def kafka_read(
    bootstrap: str,
    topic: str,
    *,
    limit: int | None = None,
    group: str | None = None,
    from_beginning: bool = True,
) -> list[KafkaRecord]:
    """The records of ``topic`` present now, up to its end offsets (it does not wait for
    more), partition by partition in offset order; at most ``limit`` of them.

    Without ``group`` nothing is committed: from the beginning, or with
    ``from_beginning=False`` from the end (nothing). With ``group``, reading starts at
    the group's committed offsets (the beginning where it has none, unless
    ``from_beginning=False``) and commits what was read, as a consumer of the group.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
    )
    await consumer.start()
    records: list[KafkaRecord] = []
    try:
        partitions = consumer.partitions_for_topic(topic)
        if partitions is None:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            raise LookupError(f"no topic {topic!r} on {bootstrap}")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        if group is None:
            await (consumer.seek_to_beginning if from_beginning else consumer.seek_to_end)(*tps)
        left = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while left and (limit is None or len(records) < limit):
            for tp, batch in (await consumer.getmany(*left, timeout_ms=1000)).items():
                for record in batch:
                    if record.offset < ends[tp] and (limit is None or len(records) < limit):
                        records.append(
                            KafkaRecord(
                                record.topic,
                                record.partition,
                                record.offset,
                                record.key,
                                record.value,
                                tuple(record.headers or ()),
                            )
                        )
                if batch and batch[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
        if group is not None and records:
            last: dict[Any, int] = {}
            for record in records:
                last[TopicPartition(record.topic, record.partition)] = record.offset + 1
            await consumer.commit(last)
    finally:
        await consumer.stop()
    records.sort(key=lambda r: (r.partition, r.offset))
    return records


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition's committed offset (``None``: nothing committed), end offset and lag."""

    topic: str
    partition: int
    committed: int | None
    end: int

    @property
    def lag(self) -> int:
        return self.end - (self.committed or 0)


async def kafka_offsets(
    bootstrap: str, group: str, topic: str | None = None
) -> list[PartitionOffsets]:
    """Per partition the group committed on (of ``topic`` only, or every partition of
    ``topic`` when given): its committed offset, end offset and lag."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await admin.start()
    try:
        await consumer.start()
        try:
            got = await admin.list_consumer_group_offsets(group)
            committed = {tp: meta.offset for tp, meta in got.items() if meta.offset >= 0}
            if topic is not None:
                await consumer._client.force_metadata_update()
                known = consumer.partitions_for_topic(topic) or set()
                tps = [TopicPartition(topic, p) for p in sorted(known)]
            else:
                tps = sorted(committed, key=lambda tp: (tp.topic, tp.partition))
            ends = await consumer.end_offsets(tps) if tps else {}
        finally:
            await consumer.stop()
    finally:
        await admin.close()
    return [PartitionOffsets(tp.topic, tp.partition, committed.get(tp), ends[tp]) for tp in tps]


# -- SQS ---------------------------------------------------------------------------------


async def sqs_publish(
    client: Any, queue_url: str, messages: Iterable[bytes | str | Outgoing]
) -> int:
    """Send ``messages`` to ``queue_url`` in order with an aiobotocore SQS ``client``;
    return how many. On a FIFO queue the key is the message group (default ``"0"``) and
    each message gets a fresh deduplication id."""
    fifo = queue_url.endswith(".fifo")
    sent = 0
    for message in map(_outgoing, messages):
        request: dict[str, Any] = {
            "QueueUrl": queue_url,
            "MessageBody": _text(message.body),
            "MessageAttributes": {
                name: {"DataType": "String", "StringValue": _text(value)}
                for name, value in message.headers.items()
            },
        }
        if fifo:
            request["MessageGroupId"] = "0" if message.key is None else _text(message.key)
            request["MessageDeduplicationId"] = f"{time.time_ns()}-{sent}"
        await client.send_message(**request)
        sent += 1
    return sent


_DEPTHS = {
    "ApproximateNumberOfMessages": "visible",
    "ApproximateNumberOfMessagesNotVisible": "in flight",
    "ApproximateNumberOfMessagesDelayed": "delayed",
}


async def sqs_wait_drained(client: Any, queue_url: str, within: float = 30) -> None:
    """Wait until ``queue_url`` holds no visible, in-flight or delayed message: every
    message sent was deleted (handled, or moved to a dead-letter queue)."""

    async def outstanding() -> str | None:
        got = await client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=list(_DEPTHS))
        counts = {what: int(got["Attributes"].get(name, 0)) for name, what in _DEPTHS.items()}
        left = [f"{count} {what}" for what, count in counts.items() if count]
        return ", ".join(left) or None

    await _wait(f"queue {queue_url} is not empty", outstanding, within)


# -- Pub/Sub -----------------------------------------------------------------------------


async def pubsub_publish(
    publisher: Any, topic: str, messages: Iterable[bytes | str | Outgoing]
) -> int:
    """Publish ``messages`` to ``topic`` (its full name) in order with a
    ``PublisherAsyncClient``, one request each; return how many. The key is the
    ordering key."""
    from google.pubsub_v1 import PubsubMessage

    sent = 0
    for message in map(_outgoing, messages):
        await publisher.publish(
            topic=topic,
            messages=[
                PubsubMessage(
                    data=_bytes(message.body),
                    ordering_key="" if message.key is None else _text(message.key),
                    attributes={name: _text(value) for name, value in message.headers.items()},
                )
            ],
        )
        sent += 1
    return sent
