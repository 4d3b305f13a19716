"""Service Bus refusing the credentials (or the Listen claim) is a permanent error
(docs/production.md#security): ``run()`` raises ``AuthenticationFailed`` at once instead
of restarting the group as for an outage."""

from __future__ import annotations

import asyncio

import pytest
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError

from ackgate import AuthenticationFailed, Message, Service
from ackgate_servicebus import ServiceBusStreamProducer

from .fake_servicebus import FakeServiceBus


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ServiceBusAuthenticationError(message="InvalidSignature"), "authentication failed"),
        (ServiceBusAuthorizationError(message="Unauthorized access"), "access denied"),
    ],
)
async def test_a_refused_receive_is_raised_by_run_not_restarted(
    error: Exception, reason: str
) -> None:
    bus = FakeServiceBus()
    bus.create_queue("q")
    bus.unreachable = error
    service = Service(
        "sb-refused",
        producer=lambda: ServiceBusStreamProducer(
            client_factory=bus.client, queue_name="q", max_wait_time=0.2
        ),
        restart_backoff=0.0,
    )

    @service.handler("h")
    async def handle(message: Message) -> None:
        pass

    with pytest.raises(AuthenticationFailed, match=f"^{reason}") as raised:
        async with asyncio.timeout(10):
            await service.run()
    assert "queue 'q'" in str(raised.value)
    assert raised.value.__cause__ is error
    assert service.stats().restarts == 0
