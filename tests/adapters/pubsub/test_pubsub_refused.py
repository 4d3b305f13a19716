"""Pub/Sub answering ``PERMISSION_DENIED`` or ``UNAUTHENTICATED`` to a pull is a refusal,
not an outage (docs/production.md#security): the producer raises ``AuthenticationFailed``
naming the subscription and the status. No emulator needed: the SDK client is a stub."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as gexc

from ackgate import AuthenticationFailed
from ackgate_pubsub import PubSubStreamProducer

SUBSCRIPTION = "projects/p/subscriptions/orders"


class RefusingSubscriber:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def pull(self, **request: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            gexc.PermissionDenied("User not authorized to perform this action."),
            "access denied pulling",
        ),
        (
            gexc.Unauthenticated("Request had invalid authentication credentials."),
            "refused pulling",
        ),
    ],
)
async def test_a_refused_pull_is_authentication_failed(error: Exception, expected: str) -> None:
    producer = PubSubStreamProducer(SUBSCRIPTION)
    with pytest.raises(AuthenticationFailed) as raised:
        await producer._pull(RefusingSubscriber(error), 10)  # type: ignore[arg-type]
    text = str(raised.value)
    assert text.startswith(f"{expected} {SUBSCRIPTION} (")
    assert raised.value.__cause__ is error
