"""ackgate: read a broker once, fan each event out to many handlers, and advance the
broker only after every handler is done with it.

The public names live here; the modules behind them are private. Topology:
:class:`SharedStreamProducer` (the broker side) feeds a group's fan-out log, each
:class:`Subscription` reads it through its own cursor, and a lane tracker hands
resolved events back to the producer in order. :class:`Service` runs decorated
handlers over one shared stream and keeps it up.
"""

from ackgate._contract.dead_letters import DeadLetter
from ackgate._contract.deliveries import DeliveryCounts
from ackgate._contract.errors import (
    AckGateError,
    AckTimeout,
    AdvanceFailed,
    AuthenticationFailed,
    PermanentError,
    StreamTerminated,
    SubscriberOverflow,
    TLSVerificationFailed,
)
from ackgate._contract.message import Message, Reject
from ackgate._contract.options import check_options, masked_options
from ackgate._contract.outcome import AdvanceItem, AdvanceOutcome, AdvanceRun, EventBatch, IdRange
from ackgate._contract.producer import SharedStreamProducer
from ackgate._contract.progress import SubscriberProgress
from ackgate._contract.stats import BrokerLag, GroupStats, OldestOutstanding
from ackgate._core.bindings import BoundBatch
from ackgate._core.manager import SharedStreamManager
from ackgate._core.subscription import Subscription, reject_shared_stream_event
from ackgate._service.handlers import HandlerStats, OldestMessage, ServiceStats
from ackgate._service.retry import Redelivery, Retry
from ackgate._service.service import Service
from ackgate._version import __version__ as __version__

__all__ = [
    "AckGateError",
    "AckTimeout",
    "AdvanceFailed",
    "AdvanceItem",
    "AdvanceOutcome",
    "AdvanceRun",
    "AuthenticationFailed",
    "BoundBatch",
    "BrokerLag",
    "DeadLetter",
    "DeliveryCounts",
    "EventBatch",
    "GroupStats",
    "HandlerStats",
    "IdRange",
    "Message",
    "OldestMessage",
    "OldestOutstanding",
    "PermanentError",
    "Redelivery",
    "Reject",
    "Retry",
    "Service",
    "ServiceStats",
    "SharedStreamManager",
    "SharedStreamProducer",
    "StreamTerminated",
    "SubscriberOverflow",
    "SubscriberProgress",
    "Subscription",
    "TLSVerificationFailed",
    "check_options",
    "masked_options",
    "reject_shared_stream_event",
]

# Public names report the module users import them from, not the private one that
# defines them: reprs, tracebacks and pickles say ``ackgate.Service``.
for _public in __all__:
    globals()[_public].__module__ = __name__
del _public
