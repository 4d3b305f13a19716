"""docs/production.md#watching-it traces on Service Bus (the fake broker): ``traceparent`` as an
application property; the handler's span continues the producer's trace and logs carry the ids."""

from __future__ import annotations

from ackgate_servicebus import ServiceBusStreamProducer
from ackgate_test_support.otel import trace_through

from .fake_servicebus import FakeServiceBus


async def test_handler_span_continues_the_application_property_traceparent() -> None:
    bus = FakeServiceBus(lock_duration=5.0)
    bus.create_queue("q")

    async def send(carrier: dict[str, str]) -> None:
        bus.send("q", b"traced", application_properties=dict(carrier))

    await trace_through(
        lambda: ServiceBusStreamProducer(
            client_factory=bus.client, queue_name="q", max_wait_time=0.05
        ),
        send,
        "servicebus",
    )
