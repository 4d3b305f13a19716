"""What a :class:`~ackgate.Service` handler receives, and how it refuses it."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic

#: What ``decode=`` makes of a message's body (``Message[Order]``: ``message.value`` is an
#: Order). For type checkers it defaults to ``Any`` (PEP 696), so a bare ``Message`` is
#: ``Message[Any]``; Python 3.11's own ``TypeVar`` takes no default.
if TYPE_CHECKING:
    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)
else:
    from typing import TypeVar

    T = TypeVar("T")

_NO_HEADERS: Mapping[str, bytes] = MappingProxyType({})

#: The header (attribute) of a copy ``ackgate dlq replay --handler ID`` sends: only the
#: handler of that id is handed it; the service's other handlers ack it unseen.
REPLAY_TO_HEADER = "ackgate.replay-to"
#: The header of every replayed copy: how many times its message was replayed. A copy
#: rejected again is dead-lettered with it, and is not replayed again unless asked.
REPLAYED_HEADER = "ackgate.replayed"
#: The header of a copy ``ackgate dlq replay --service KEY`` sends: a service of another
#: key (another consumer of the same topic) acks it unseen, in every handler.
REPLAY_SERVICE_HEADER = "ackgate.replay-service"


@dataclass(frozen=True, slots=True, kw_only=True)
class _MessageFields(Generic[T]):
    """:class:`Message`'s fields (documented there)."""

    body: bytes
    id: str
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=lambda: _NO_HEADERS)
    lane: Hashable = None
    attempt: int | None = None
    raw: Any = None
    value: T = None  # type: ignore[assignment]  # None without decode=, a T with it

    def __repr__(self) -> str:
        return (
            f"Message(id={self.id!r}, lane={self.lane!r}, attempt={self.attempt!r}, "
            f"body=<{len(self.body)} bytes>)"
        )


class Message(_MessageFields[T]):
    """One broker message, converted once per event by the producer's ``to_message``.

    The same object is handed to every handler of a service without ``decode=``:
    treat it (and its ``headers``) as read-only. A handler with ``decode=`` gets a
    copy whose ``value`` is the decoded body: annotate it ``Message[Order]`` and
    ``message.value`` is an ``Order`` for a type checker. Its ``repr`` names the
    message but never shows the body, so it is safe in logs.

    Attributes:
        body: The payload, as the broker stored it.
        id: The broker's id: Kafka ``topic/partition/offset``, SQS ``MessageId``,
            Pub/Sub ``message_id``, Service Bus ``message_id``, memory
            ``topic/partition/offset``.
        key: The broker's message key (Kafka key, SQS FIFO group, Pub/Sub ordering
            key, Service Bus session), if any.
        headers: The message's headers (Kafka headers, SQS message attributes,
            Pub/Sub attributes, Service Bus application properties) as bytes.
        lane: ``producer.get_advance_lane(payload)``: the unit of ``ordering="lane"``.
        attempt: How many times it was delivered, this delivery included: an
            ``int >= 1`` on every adapter of ackgate. The broker's own count where
            it keeps one (SQS ``ApproximateReceiveCount``, Pub/Sub
            ``delivery_attempt`` on a subscription with a dead-letter policy,
            Service Bus ``delivery_count + 1``, the memory broker's count per
            consumer group), which survives restarts; elsewhere (Pub/Sub without
            that policy) the producer counts the deliveries it made, from 1 again
            in a new producer (a restart). A handler's ``give_up_after`` compares
            against it. ``None`` only from a producer that counts nothing (the
            default ``to_message``).
        raw: The adapter's native object (a Kafka record, an SQS message dict, ...).
        value: The body as the handler's ``decode=`` made it
            (docs/getting-started.md#typed-payloads);
            ``None`` for a handler without ``decode=``.
    """

    # A slot of its own, not a dataclass field: ``Message(**fields)``, ``replace`` and
    # pickling never see it.
    __slots__ = ("_decoded",)
    #: Per decoder, what it made of the body (or the Reject it became): handlers that
    #: share a decoder decode each message once. Unset until the first decode.
    _decoded: dict[object, object]


class Reject(Exception):
    """Raise it from a handler to reject the message: it is dead-lettered, never retried.

    ``reason`` (a ``str`` or ``None``) reaches the producer in
    ``AdvanceOutcome.reasons`` and from there the dead-letter record. A batch
    handler may also *return* ``{message.id: Reject(reason), ...}`` to reject some
    messages of its batch and ack the rest.
    """

    def __init__(self, reason: str | None = None) -> None:
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"Reject(reason) takes a str or None, got {type(reason).__name__}")
        super().__init__(reason)
        self.reason = reason
