"""One pulled Pub/Sub message and the :class:`~ackgate.Message` a handler gets.

The field mapping is documented with the producer, in :mod:`ackgate_pubsub._producer`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ackgate import Message

# A protobuf google.pubsub.v1.ReceivedMessage (the SDK types it loosely).
Received = Any


def to_message(received: Received, lane: Hashable, attempt: int) -> Message:
    """The :class:`~ackgate.Message` of ``received``, whose lane is ``lane``, on its
    delivery number ``attempt``."""
    message = received.message
    return Message(
        body=bytes(message.data),
        key=message.ordering_key.encode() if message.ordering_key else None,
        headers={name: value.encode() for name, value in message.attributes.items()},
        id=message.message_id,
        lane=lane,
        attempt=attempt,
        raw=received,
    )
