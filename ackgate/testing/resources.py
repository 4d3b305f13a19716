"""Fresh topics, queues and subscriptions per test, on the brokers of :mod:`.brokers`.

Each helper names what it creates ``ackgate-<hex>`` so tests sharing a session broker
never see each other's messages. Each call opens and closes its own client, so a
helper can be used from any event loop; nothing is deleted afterwards (the broker
goes with the session). The broker's SDK is imported on first use.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from ackgate.testing import traffic
from ackgate.testing.brokers import KafkaBroker, PubSubBroker, SqsBroker
from ackgate.testing.traffic import Outgoing


def unique(prefix: str = "ackgate") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class KafkaFresh:
    """``await fresh.topic(partitions=3)`` creates a topic; ``fresh.group()`` names a group."""

    def __init__(self, broker: KafkaBroker) -> None:
        self.broker = broker
        self.bootstrap = broker.bootstrap

    async def topic(self, partitions: int = 1) -> str:
        name = unique()
        await traffic.kafka_create_topic(self.bootstrap, name, partitions)
        return name

    def group(self) -> str:
        return unique("group")

    async def publish(self, topic: str, messages: Iterable[bytes | str | Outgoing]) -> int:
        """Publish ``messages`` in order (see :func:`~ackgate.testing.traffic.kafka_publish`)."""
        return await traffic.kafka_publish(self.bootstrap, topic, messages)

    async def records(self, topic: str, limit: int | None = None) -> list[traffic.KafkaRecord]:
        """The records ``topic`` holds now, with key, headers and offsets (see
        :func:`~ackgate.testing.traffic.kafka_read`); nothing is committed."""
        return await traffic.kafka_read(self.bootstrap, topic, limit=limit)

    async def wait_advanced(self, topic: str, group: str, within: float = 30) -> None:
        """Wait until ``group`` committed every partition's end offset, else
        :class:`~ackgate.testing.traffic.StillOutstanding` naming the partitions behind."""
        await traffic.kafka_wait_advanced(self.bootstrap, topic, group, within)


class SqsFresh:
    """``await fresh.queue(fifo=True, dead_letter_to=url)`` creates a queue, returns its URL."""

    def __init__(self, broker: SqsBroker) -> None:
        self.broker = broker
        self.endpoint_url = broker.endpoint_url
        # One session for every client of this helper: a new session parses botocore's
        # service and endpoint data again (a few tenths of a second each client). It
        # holds no connection and nothing of an event loop; each client is its own.
        self._session: Any = None

    def client(self) -> Any:
        """An aiobotocore SQS client context manager for this endpoint."""
        if self._session is None:
            from aiobotocore.session import get_session

            self._session = get_session()
        return self._session.create_client(
            "sqs",
            region_name=self.broker.region_name,
            endpoint_url=self.broker.endpoint_url,
            aws_access_key_id=self.broker.aws_access_key_id,
            aws_secret_access_key=self.broker.aws_secret_access_key,
        )

    async def queue(
        self, *, fifo: bool = False, dead_letter_to: str | None = None, max_receive_count: int = 2
    ) -> str:
        name = unique() + (".fifo" if fifo else "")
        attributes: dict[str, str] = {"FifoQueue": "true"} if fifo else {}
        async with self.client() as client:
            if dead_letter_to is not None:
                got = await client.get_queue_attributes(
                    QueueUrl=dead_letter_to, AttributeNames=["QueueArn"]
                )
                attributes["RedrivePolicy"] = json.dumps(
                    {
                        "deadLetterTargetArn": got["Attributes"]["QueueArn"],
                        "maxReceiveCount": str(max_receive_count),
                    }
                )
            response = await client.create_queue(QueueName=name, Attributes=attributes)
        return str(response["QueueUrl"])

    async def publish(self, queue_url: str, messages: Iterable[bytes | str | Outgoing]) -> int:
        """Send ``messages`` in order (see :func:`~ackgate.testing.traffic.sqs_publish`)."""
        async with self.client() as client:
            return await traffic.sqs_publish(client, queue_url, messages)

    async def wait_drained(self, queue_url: str, within: float = 30) -> None:
        """Wait until the queue holds nothing visible, in flight or delayed, else
        :class:`~ackgate.testing.traffic.StillOutstanding` with the counts left."""
        async with self.client() as client:
            await traffic.sqs_wait_drained(client, queue_url, within)


class PubSubFresh:
    """``await fresh.topic()`` and ``await fresh.subscription(topic, ordering=True)``
    create resources in the broker's project and return their full names."""

    def __init__(self, broker: PubSubBroker) -> None:
        self.broker = broker
        self.emulator_host = broker.emulator_host

    def _clients(self) -> tuple[Any, Any]:
        import grpc
        from google.pubsub_v1 import PublisherAsyncClient, SubscriberAsyncClient
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
        from google.pubsub_v1.services.subscriber.transports import (
            SubscriberGrpcAsyncIOTransport,
        )

        channel = grpc.aio.insecure_channel(self.emulator_host)
        publisher = PublisherAsyncClient(transport=PublisherGrpcAsyncIOTransport(channel=channel))
        channel = grpc.aio.insecure_channel(self.emulator_host)
        subscriber = SubscriberAsyncClient(
            transport=SubscriberGrpcAsyncIOTransport(channel=channel)
        )
        return publisher, subscriber

    async def topic(self) -> str:
        name = f"projects/{self.broker.project}/topics/{unique()}"
        publisher, subscriber = self._clients()
        try:
            await publisher.create_topic(name=name)
        finally:
            await publisher.transport.close()
            await subscriber.transport.close()
        return name

    async def publish(self, topic: str, messages: Iterable[bytes | str | Outgoing]) -> int:
        """Publish ``messages`` in order (see :func:`~ackgate.testing.traffic.pubsub_publish`)."""
        publisher, subscriber = self._clients()
        try:
            return await traffic.pubsub_publish(publisher, topic, messages)
        finally:
            await publisher.transport.close()
            await subscriber.transport.close()

    async def subscription(
        self,
        topic: str,
        *,
        ordering: bool = False,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
        ack_deadline_seconds: int = 10,
    ) -> str:
        from google.pubsub_v1 import DeadLetterPolicy, Subscription

        name = f"projects/{self.broker.project}/subscriptions/{unique()}"
        request = Subscription(
            name=name,
            topic=topic,
            ack_deadline_seconds=ack_deadline_seconds,
            enable_message_ordering=ordering,
        )
        if dead_letter_topic is not None:
            request.dead_letter_policy = DeadLetterPolicy(
                dead_letter_topic=dead_letter_topic, max_delivery_attempts=max_delivery_attempts
            )
        publisher, subscriber = self._clients()
        try:
            await subscriber.create_subscription(request=request)
        finally:
            await publisher.transport.close()
            await subscriber.transport.close()
        return name
