"""Amazon SQS adapter for ackgate: :class:`SqsStreamProducer` on aiobotocore.

The producer and its full documentation (what each outcome does to the broker, lanes,
errors, logging) are in :mod:`ackgate_sqs._producer`; the other private modules are its
parts: the received message (``_message``), batch calls (``_batches``) and the
dead-letter record (``_dead_letter``).
"""

from ackgate_sqs._dead_letter import REASON_ATTRIBUTE
from ackgate_sqs._producer import SqsStreamProducer

__all__ = [
    "REASON_ATTRIBUTE",
    "SqsStreamProducer",
]
