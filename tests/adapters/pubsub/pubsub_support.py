"""Topic / subscription management and a recording producer for the Pub/Sub adapter
tests (imported relatively: ``from .pubsub_support import ...``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.api_core.exceptions import DeadlineExceeded
from google.pubsub_v1 import (
    DeadLetterPolicy,
    PublisherAsyncClient,
    PubsubMessage,
    ReceivedMessage,
    SubscriberAsyncClient,
    Subscription,
)
from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate_pubsub import PubSubStreamProducer

PROJECT = "ackgate-test"


def text(received: ReceivedMessage) -> str:
    return bytes(received.message.data).decode()


class PubSubAdmin:
    """Test-side resource management and inspection through plain GAPIC async clients."""

    def __init__(self, host: str) -> None:
        self.subscriber = SubscriberAsyncClient(
            transport=SubscriberGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(host))
        )
        self.publisher = PublisherAsyncClient(
            transport=PublisherGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(host))
        )

    async def aclose(self) -> None:
        await self.subscriber.transport.close()
        await self.publisher.transport.close()

    async def create_topic(self) -> str:
        topic = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:12]}"
        await self.publisher.create_topic(name=topic)
        return topic

    async def create_subscription(
        self,
        topic: str,
        *,
        ordering: bool = False,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
        exactly_once: bool = False,
    ) -> str:
        name = f"projects/{PROJECT}/subscriptions/s-{uuid.uuid4().hex[:12]}"
        request = Subscription(
            name=name,
            topic=topic,
            ack_deadline_seconds=10,
            enable_message_ordering=ordering,
            enable_exactly_once_delivery=exactly_once,
        )
        if dead_letter_topic is not None:
            request.dead_letter_policy = DeadLetterPolicy(
                dead_letter_topic=dead_letter_topic, max_delivery_attempts=max_delivery_attempts
            )
        created = await self.subscriber.create_subscription(request=request)
        if dead_letter_topic is not None:
            # Fail loudly if the emulator dropped the policy instead of honouring it.
            assert created.dead_letter_policy.dead_letter_topic == dead_letter_topic
        return name

    async def publish(
        self,
        topic: str,
        bodies: Sequence[str],
        *,
        ordering_key: str = "",
        attributes: dict[str, str] | None = None,
    ) -> None:
        """Publish in order, up to 1000 per request (one ordering key per request)."""
        for start in range(0, len(bodies), 1000):
            await self.publisher.publish(
                topic=topic,
                messages=[
                    PubsubMessage(
                        data=body.encode(), ordering_key=ordering_key, attributes=attributes or {}
                    )
                    for body in bodies[start : start + 1000]
                ],
            )

    async def pull(self, subscription: str, *, wait: float) -> list[ReceivedMessage]:
        """What a long-poll of up to ``wait`` seconds returns (empty when it runs out)."""
        try:
            response = await self.subscriber.pull(
                subscription=subscription, max_messages=1000, timeout=wait
            )
        except DeadlineExceeded:
            return []
        return list(response.received_messages)

    async def ack(self, subscription: str, received: Sequence[ReceivedMessage]) -> None:
        if received:
            await self.subscriber.acknowledge(
                subscription=subscription, ack_ids=[r.ack_id for r in received]
            )


class RecordingProducer(PubSubStreamProducer):
    """The real adapter, also recording every advanced message as (body, outcome)."""

    def __init__(self, subscription: str, **options: Any) -> None:
        super().__init__(subscription, **options)
        self.advanced: list[tuple[str, AdvanceOutcome]] = []
        self._changed = asyncio.Condition()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        await super().advance(batch)
        async with self._changed:
            self.advanced.extend((text(item.broker_payload), item.outcome) for item in batch)
            self._changed.notify_all()

    async def wait_until(
        self, predicate: Callable[[list[tuple[str, AdvanceOutcome]]], bool]
    ) -> None:
        """Wait until ``predicate(self.advanced)`` holds; bound it with ``asyncio.timeout``."""
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self.advanced))
