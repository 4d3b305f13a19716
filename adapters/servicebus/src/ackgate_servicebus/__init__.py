"""Azure Service Bus adapter for ackgate: :class:`ServiceBusStreamProducer`, on
azure-servicebus (its ``aio`` API).

The implementation and its full documentation (what each outcome does to the broker,
lanes, errors, logging) are in :mod:`ackgate_servicebus._producer`.
"""

from ackgate_servicebus._producer import (
    DEAD_LETTER_REASON,
    NEXT_AVAILABLE_SESSION,
    ServiceBusStreamProducer,
)

__all__ = [
    "DEAD_LETTER_REASON",
    "NEXT_AVAILABLE_SESSION",
    "ServiceBusStreamProducer",
]
