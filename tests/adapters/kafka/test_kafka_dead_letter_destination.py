"""docs/failure-semantics.md#poison-messages: a Kafka producer can take ``give_up_after`` only with
``dlq_topic`` (without it a rejected event is committed past with a log line, so a service with the
option refuses to start on it). No broker needed: nothing connects here."""

from __future__ import annotations

import pytest

from ackgate import Message, Service
from ackgate_kafka import KafkaStreamProducer


def make(dlq_topic: str | None = None) -> KafkaStreamProducer:
    return KafkaStreamProducer(
        "orders", bootstrap_servers="localhost:1", group_id="g", dlq_topic=dlq_topic
    )


def test_the_dead_letter_destination_is_dlq_topic() -> None:
    assert make().dead_letter_destination() is None
    assert make("orders.dlq").dead_letter_destination() == "Kafka topic orders.dlq"


async def test_a_service_giving_up_without_dlq_topic_refuses_to_start() -> None:
    service = Service("orders", producer=make)

    @service.handler("indexer", give_up_after=3)
    async def indexer(message: Message) -> None:
        pass

    with pytest.raises(ValueError, match=r"'indexer' sets give_up_after=3.*\(KafkaStreamProdu"):
        await service.run()
