"""Azure Service Bus adapter for ackgate: :class:`ServiceBusStreamProducer`, on
azure-servicebus (its ``aio`` API).

The producer and its full documentation (what each outcome does to the broker, lanes,
errors, logging) are in :mod:`ackgate_servicebus._producer`; the other private modules
are its parts: the received message (``_message``), lock keeping (``_locks``) and the
dead-letter reason and description (``_dead_letter``).
"""

from ackgate_servicebus._dead_letter import DEAD_LETTER_REASON
from ackgate_servicebus._producer import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusStreamProducer,
)

__all__ = [
    "DEAD_LETTER_REASON",
    "NEXT_AVAILABLE_SESSION",
    "ServiceBusStreamProducer",
]
