"""Amazon SQS adapter for ackgate: :class:`SqsStreamProducer` on aiobotocore.

The implementation and its full documentation (what each outcome does to the broker,
lanes, errors, logging) are in :mod:`ackgate_sqs._producer`.
"""

from ackgate_sqs._producer import REASON_ATTRIBUTE, SqsStreamProducer

__all__ = [
    "REASON_ATTRIBUTE",
    "SqsStreamProducer",
]
