"""``ackgate dlq`` on Pub/Sub: the destination is a **subscription** on the ``dlq_topic``
(a topic keeps nothing for a reader that has none). Its messages are pulled and held
(not acked) while the command runs, and let go again at its end; a replayed one is
published to the topic of its source subscription (``ackgate-source-subscription``),
then acked on the DLQ subscription. Every subscription of that topic receives the
copy: ``--service KEY`` makes the other ackgate services ack it unseen.

Registered as the ``pubsub`` entry of the ``ackgate.dead_letters`` group. The
connection is the adapter's: ``PUBSUB_EMULATOR_HOST`` when set, else Application
Default Credentials.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ackgate import DeadLetter
from ackgate_pubsub._dead_letter import REASON_ATTRIBUTE, SOURCE_ATTRIBUTE

#: Seconds one pull waits for messages while reading the DLQ subscription.
_PULL_TIMEOUT = 2.0


def open_dead_letters(destination: str, options: Mapping[str, str]) -> PubSubDeadLetters:
    """The ``ackgate.dead_letters`` entry: ``destination`` is a subscription's full name
    (``projects/P/subscriptions/S``) on the DLQ topic; no ``-o`` option is needed."""
    if "/subscriptions/" not in destination:
        raise ValueError(
            "pubsub: the destination is a subscription on the DLQ topic, projects/P/subscriptions/S"
        )
    if options:
        raise ValueError(f"pubsub: unknown -o option(s) {sorted(options)}")
    return PubSubDeadLetters(destination)


class PubSubDeadLetters:
    """The DLQ subscription ``subscription``."""

    def __init__(self, subscription: str) -> None:
        self.subscription = subscription
        self._subscriber: Any = None
        self._publisher: Any = None
        #: Ack ids of what :meth:`read` holds and :meth:`replay` did not ack.
        self._held: dict[str, str] = {}
        #: Source subscription -> its topic.
        self._topics: dict[str, str] = {}

    def _clients(self) -> tuple[Any, Any]:
        if self._subscriber is None:
            try:
                import grpc
                from google.pubsub_v1 import PublisherAsyncClient, SubscriberAsyncClient
                from google.pubsub_v1.services.publisher.transports import (
                    PublisherGrpcAsyncIOTransport,
                )
                from google.pubsub_v1.services.subscriber.transports import (
                    SubscriberGrpcAsyncIOTransport,
                )
            except ImportError as exc:
                raise ImportError(
                    "ackgate-pubsub needs google-cloud-pubsub: pip install 'ackgate[pubsub]'"
                ) from exc
            emulator = os.environ.get("PUBSUB_EMULATOR_HOST")
            if emulator:
                self._subscriber = SubscriberAsyncClient(
                    transport=SubscriberGrpcAsyncIOTransport(
                        channel=grpc.aio.insecure_channel(emulator)
                    )
                )
                self._publisher = PublisherAsyncClient(
                    transport=PublisherGrpcAsyncIOTransport(
                        channel=grpc.aio.insecure_channel(emulator)
                    )
                )
            else:
                self._subscriber, self._publisher = SubscriberAsyncClient(), PublisherAsyncClient()
        return self._subscriber, self._publisher

    async def read(self) -> list[DeadLetter]:
        from google.api_core.exceptions import DeadlineExceeded

        subscriber, _ = self._clients()
        letters: list[DeadLetter] = []
        while True:
            try:
                response = await subscriber.pull(
                    subscription=self.subscription, max_messages=100, timeout=_PULL_TIMEOUT
                )
            except DeadlineExceeded:
                return letters
            fresh = [
                r for r in response.received_messages if r.message.message_id not in self._held
            ]
            if not fresh:
                return letters
            for received in fresh:
                self._held[received.message.message_id] = received.ack_id
                letters.append(_letter(received))

    async def replay(self, letter: DeadLetter, headers: Mapping[str, bytes]) -> None:
        from google.pubsub_v1 import PubsubMessage

        if not letter.source:
            raise ValueError(f"dead letter {letter.id}: no {SOURCE_ATTRIBUTE} attribute")
        subscriber, publisher = self._clients()
        topic = self._topics.get(letter.source)
        if topic is None:
            found = await subscriber.get_subscription(subscription=letter.source)
            topic = self._topics[letter.source] = str(found.topic)
        copy = PubsubMessage(
            data=letter.body,
            attributes={name: value.decode(errors="replace") for name, value in headers.items()},
            ordering_key=(letter.key or b"").decode(),
        )
        await publisher.publish(topic=topic, messages=[copy])
        ack_id = self._held.pop(letter.id, None)
        if ack_id is not None:
            await subscriber.acknowledge(subscription=self.subscription, ack_ids=[ack_id])

    async def aclose(self) -> None:
        """Let go of what was read and not replayed (deadline 0), close the clients."""
        if self._subscriber is None:
            return
        try:
            if self._held:
                await self._subscriber.modify_ack_deadline(
                    subscription=self.subscription,
                    ack_ids=list(self._held.values()),
                    ack_deadline_seconds=0,
                )
        finally:
            self._held.clear()
            await self._subscriber.transport.close()
            await self._publisher.transport.close()
            self._subscriber = self._publisher = None


def _letter(received: Any) -> DeadLetter:
    message = received.message
    attributes = dict(message.attributes)
    reason = attributes.pop(REASON_ATTRIBUTE, "")
    source = attributes.pop(SOURCE_ATTRIBUTE, "")
    headers = {name: value.encode() for name, value in attributes.items()}
    headers["ackgate.reason"] = reason.encode()
    return DeadLetter.parse(
        id=str(message.message_id),
        original_id=str(message.message_id),
        source=source,
        body=bytes(message.data),
        key=message.ordering_key.encode() if message.ordering_key else None,
        headers=headers,
        raw=received,
    )
