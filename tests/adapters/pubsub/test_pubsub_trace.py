"""docs/production.md#watching-it traces on the Pub/Sub emulator: ``traceparent`` as a message
attribute; the handler's span continues the producer's trace and logs inside it carry the ids."""

from __future__ import annotations

from ackgate_pubsub import PubSubStreamProducer
from ackgate_test_support.otel import trace_through

from .pubsub_support import PubSubAdmin


async def test_handler_span_continues_the_attribute_traceparent(pubsub: PubSubAdmin) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)

    async def send(carrier: dict[str, str]) -> None:
        await pubsub.publish(topic, ["traced"], attributes=carrier)

    await trace_through(
        lambda: PubSubStreamProducer(subscription, pull_timeout=2), send, "gcp_pubsub"
    )
