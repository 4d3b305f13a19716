"""ackgate: read a broker once, fan out to many handlers, advance only when all are done."""

from ackgate._errors import (
    AckGateError,
    AckTimeout,
    AdvanceFailed,
    StreamTerminated,
    SubscriberOverflow,
)
from ackgate._outcome import AdvanceItem, AdvanceOutcome
from ackgate._producer import SharedStreamProducer

__all__ = [
    "AckGateError",
    "AckTimeout",
    "AdvanceFailed",
    "AdvanceItem",
    "AdvanceOutcome",
    "SharedStreamProducer",
    "StreamTerminated",
    "SubscriberOverflow",
]
