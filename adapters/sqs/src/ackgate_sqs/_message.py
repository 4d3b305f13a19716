"""One received SQS message: the payload ackgate carries for it (:class:`Receipt`) and
the :class:`~ackgate.Message` a handler gets (:func:`to_message`).

The field mapping is documented with the producer, in :mod:`ackgate_sqs._producer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ackgate import Message


@dataclass(eq=False, slots=True)
class Receipt:
    """The broker payload of one received message (opaque to ackgate)."""

    message: dict[str, Any]
    lane: str
    deadline: float
    """Loop time by which the visibility lapses, counted from *before* the call that
    set it, so it errs early. Only the heartbeat moves it."""

    @property
    def message_id(self) -> str:
        return str(self.message["MessageId"])

    @property
    def handle(self) -> str:
        return str(self.message["ReceiptHandle"])


def to_message(message: dict[str, Any], receipt: Receipt) -> Message:
    """The :class:`~ackgate.Message` of ``message``, as received with ``receipt``."""
    system = message.get("Attributes", {})
    group = system.get("MessageGroupId")
    count = system.get("ApproximateReceiveCount")
    return Message(
        body=str(message.get("Body", "")).encode(),
        key=None if group is None else str(group).encode(),
        headers={
            name: _attribute_bytes(value)
            for name, value in message.get("MessageAttributes", {}).items()
        },
        id=receipt.message_id,
        lane=receipt.lane,
        attempt=None if count is None else int(count),
        raw=message,
    )


def _attribute_bytes(value: dict[str, Any]) -> bytes:
    """A message attribute's value: ``Binary`` types as they are, the others UTF-8."""
    if str(value.get("DataType", "")).startswith("Binary"):
        return bytes(value.get("BinaryValue", b""))
    return str(value.get("StringValue", "")).encode()
