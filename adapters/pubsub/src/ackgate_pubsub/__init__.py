"""Google Cloud Pub/Sub adapter for ackgate: :class:`PubSubStreamProducer`, on the SDK's
asyncio GAPIC clients.

The producer and its full documentation (what each outcome does to the broker, lanes,
errors, logging) are in :mod:`ackgate_pubsub._producer`; the other private modules are
its parts: the pulled message (``_message``), calls that take ack ids (``_ack_calls``),
the dead-letter copy (``_dead_letter``) and the exception (``_errors``).
"""

from ackgate_pubsub._dead_letter import REASON_ATTRIBUTE, SOURCE_ATTRIBUTE
from ackgate_pubsub._errors import PubSubError
from ackgate_pubsub._producer import PubSubStreamProducer

__all__ = [
    "REASON_ATTRIBUTE",
    "SOURCE_ATTRIBUTE",
    "PubSubError",
    "PubSubStreamProducer",
]
