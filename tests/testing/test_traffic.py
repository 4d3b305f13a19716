"""The test helpers of ``ackgate.testing.traffic`` on real brokers: publish with keys and
headers, wait until a consumer advanced past everything, and a timeout that names what
is still outstanding."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError

from ackgate.testing.resources import KafkaFresh, PubSubFresh, SqsFresh
from ackgate.testing.traffic import Outgoing, StillOutstanding


async def test_kafka_publish_then_wait_until_the_group_committed_everything(
    ackgate_kafka_fresh: KafkaFresh,
) -> None:
    fresh = ackgate_kafka_fresh
    topic, group = await fresh.topic(partitions=2), fresh.group()
    sent = await fresh.publish(
        topic,
        [Outgoing(b"a", key=b"k1", headers={"h": b"1"}), Outgoing("b", key="k1"), b"c"],
    )
    assert sent == 3
    with pytest.raises(StillOutstanding) as early:
        await fresh.wait_advanced(topic, group, within=0.5)
    assert f"group {group!r} has not committed all of {topic!r}" in str(early.value)
    assert "committed 0 of" in str(early.value)

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=fresh.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        records = []
        while len(records) < 3:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                records += batch
        await consumer.commit()
    finally:
        await consumer.stop()
    keyed = [r for r in records if r.key == b"k1"]
    assert [r.value for r in keyed] == [b"a", b"b"]  # one key, one partition, in order
    assert keyed[0].headers == (("h", b"1"),)
    await fresh.wait_advanced(topic, group, within=30)


async def test_kafka_wait_survives_a_coordinator_that_is_not_ready(
    ackgate_kafka_fresh: KafkaFresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh broker answers GroupCoordinatorNotAvailableError for a while."""
    fresh = ackgate_kafka_fresh
    topic = await fresh.topic()
    real = AIOKafkaAdminClient.list_consumer_group_offsets
    refusals = 3

    async def not_yet(self: AIOKafkaAdminClient, *args: Any, **kwargs: Any) -> Any:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise GroupCoordinatorNotAvailableError()
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(AIOKafkaAdminClient, "list_consumer_group_offsets", not_yet)
    await fresh.wait_advanced(topic, fresh.group(), within=30)  # empty: advanced at once
    assert refusals == 0

    refusals = 10**6
    with pytest.raises(StillOutstanding) as never:
        await fresh.wait_advanced(topic, fresh.group(), within=0.5)
    assert "GroupCoordinatorNotAvailableError (retried)" in str(never.value)


async def test_sqs_publish_then_wait_until_the_queue_is_drained(
    ackgate_sqs_fresh: SqsFresh,
) -> None:
    fresh = ackgate_sqs_fresh
    url = await fresh.queue(fifo=True)
    assert await fresh.publish(url, [Outgoing("one", key="g", headers={"h": "1"}), "two"]) == 2
    with pytest.raises(StillOutstanding) as early:
        await fresh.wait_drained(url, within=0.5)
    assert str(early.value).endswith(f"queue {url} is not empty: 2 visible")

    async with fresh.client() as client:
        got = await client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        )
        messages = got["Messages"]
        assert {m["Body"] for m in messages} <= {"one", "two"}
        with pytest.raises(StillOutstanding) as held:
            await fresh.wait_drained(url, within=0.3)
        assert "in flight" in str(held.value)
        for message in messages:
            await client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        while len(messages) < 2:  # a FIFO queue may hand out one group at a time
            got = await client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
            for message in got.get("Messages", []):
                messages.append(message)
                await client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    first = next(m for m in messages if m["Body"] == "one")
    assert first["MessageAttributes"]["h"]["StringValue"] == "1"
    await fresh.wait_drained(url, within=30)


async def test_pubsub_publish_with_ordering_keys_and_attributes(
    ackgate_pubsub_fresh: PubSubFresh,
) -> None:
    fresh = ackgate_pubsub_fresh
    topic = await fresh.topic()
    subscription = await fresh.subscription(topic, ordering=True)
    assert await fresh.publish(topic, [Outgoing("a", key="k", headers={"h": "1"}), b"b"]) == 2
    publisher, subscriber = fresh._clients()
    try:
        got: list[Any] = []
        while len(got) < 2:
            response = await subscriber.pull(subscription=subscription, max_messages=10)
            got += [received.message for received in response.received_messages]
    finally:
        await publisher.transport.close()
        await subscriber.transport.close()
    by_body = {m.data: m for m in got}
    assert sorted(by_body) == [b"a", b"b"]
    assert (by_body[b"a"].ordering_key, dict(by_body[b"a"].attributes)) == ("k", {"h": "1"})
