"""Google Cloud Pub/Sub adapter for ackgate: :class:`PubSubStreamProducer`, on the SDK's
asyncio GAPIC clients.

The implementation and its full documentation (what each outcome does to the broker,
lanes, errors, logging) are in :mod:`ackgate_pubsub._producer`.
"""

from ackgate_pubsub._producer import (
    REASON_ATTRIBUTE,
    SOURCE_ATTRIBUTE,
    PubSubError,
    PubSubStreamProducer,
)

__all__ = [
    "REASON_ATTRIBUTE",
    "SOURCE_ATTRIBUTE",
    "PubSubError",
    "PubSubStreamProducer",
]
