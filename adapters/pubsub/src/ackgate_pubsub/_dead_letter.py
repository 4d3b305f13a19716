"""Rejected messages published to ``dlq_topic``: the copy (data, attributes and ordering
key, plus :data:`REASON_ATTRIBUTE` and :data:`SOURCE_ATTRIBUTE`) and its publish.

When this happens, and what happens without a ``dlq_topic``, is documented with the
producer, in :mod:`ackgate_pubsub._producer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import getLogger
from typing import Any

from ackgate import AdvanceOutcome
from ackgate_pubsub._errors import PubSubError
from ackgate_pubsub._message import Received

logger = getLogger("ackgate.adapters.pubsub")

REASON_ATTRIBUTE = "ackgate-reason"
SOURCE_ATTRIBUTE = "ackgate-source-subscription"

_ATTRIBUTE_LIMIT = 1024  # bytes in one attribute value


async def publish_dead_letters(
    publisher: Any,
    dlq_topic: str,
    subscription: str,
    dead: Sequence[tuple[Received, AdvanceOutcome]],
) -> None:
    """Publish a copy of each rejected message, in order; raise :class:`PubSubError`
    at the first failed publish."""
    # Imported here, not at the top: importing the adapter must not need the SDK, and
    # this runs only once the producer has connected.
    from google.api_core import exceptions as gexc
    from google.pubsub_v1 import PubsubMessage

    for received, outcome in dead:
        original = received.message
        attributes = dict(original.attributes)
        total = outcome.acked + outcome.rejected + outcome.failed
        summary = f"rejected by {outcome.rejected} of {total} subscribers"
        attributes[REASON_ATTRIBUTE] = _capped("; ".join((summary, *outcome.reasons)))
        attributes[SOURCE_ATTRIBUTE] = subscription
        copy = PubsubMessage(
            data=original.data, attributes=attributes, ordering_key=original.ordering_key
        )
        # One request per message: rejects are rare, and a request is then always
        # within the size limits and carries one ordering key, in lane order.
        try:
            await publisher.publish(topic=dlq_topic, messages=[copy])
        except gexc.GoogleAPIError as exc:
            raise PubSubError(f"publish to {dlq_topic} failed: {exc}") from exc
    logger.info("Dead-lettered %d messages to %s", len(dead), dlq_topic)


def _capped(text: str) -> str:
    """``text`` within Pub/Sub's 1024-byte limit on an attribute value."""
    data = text.encode()
    if len(data) <= _ATTRIBUTE_LIMIT:
        return text
    return data[: _ATTRIBUTE_LIMIT - 3].decode(errors="ignore") + "..."
