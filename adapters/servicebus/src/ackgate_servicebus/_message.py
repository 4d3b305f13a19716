"""One received Service Bus message: the :class:`~ackgate.Message` a handler gets, and how
logs name it (ids only, never a body).

The field mapping is documented with the producer, in :mod:`ackgate_servicebus._producer`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ackgate import Message


def to_message(message: Any, lane: Hashable) -> Message:
    """The :class:`~ackgate.Message` of a ``ServiceBusReceivedMessage`` in lane ``lane``."""
    properties = message.application_properties or {}
    count = message.delivery_count
    return Message(
        body=_body_bytes(message.body),
        key=None if message.session_id is None else str(message.session_id).encode(),
        headers={_text(name): _value_bytes(value) for name, value in properties.items()},
        id=str(message.message_id or message.sequence_number),
        lane=lane,
        attempt=None if count is None else count + 1,
        raw=message,
    )


def ids(message: Any) -> str:
    """The message as log lines name it."""
    return f"message_id={message.message_id} sequence_number={message.sequence_number}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def _value_bytes(value: Any) -> bytes:
    """An application property value as bytes: bytes as they are, the rest UTF-8."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


def _body_bytes(body: Any) -> bytes:
    """The body as bytes: a data body (bytes, or an iterable of bytes sections) joined;
    a ``str`` value body as UTF-8; any other value body as its ``str()`` in UTF-8."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    try:
        sections = list(body)
    except TypeError:
        return str(body).encode()
    if all(isinstance(section, bytes | bytearray | memoryview) for section in sections):
        return b"".join(bytes(section) for section in sections)
    return str(sections).encode()
