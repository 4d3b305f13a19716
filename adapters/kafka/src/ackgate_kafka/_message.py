"""Kafka records as :class:`ackgate.Message` s, read from the record on access.

A ``Service`` converts every record once, in the poll, before fan-out, so the
conversion is on the hot path of every message. :class:`RecordMessage` is a
``Message`` (a subclass: ``isinstance``, ``dataclasses.fields``, ``asdict`` and
``repr`` work as for any) that keeps the body, the record, its partition and its
attempt number, and reads the other fields from the record when asked: building
one costs four slot writes, where the dataclass constructor costs seven frozen
writes and an id string per record. ``dataclasses.replace``, ``copy`` and
``pickle`` give a plain ``Message`` with the same fields.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ackgate import Message

_new = object.__new__
_NO_HEADERS: Mapping[str, bytes] = MappingProxyType({})


def check_value(producer: object, value: object) -> None:
    """A ``Message`` body is bytes: a record value must be bytes or ``None``."""
    if value is not None and not isinstance(value, bytes):
        raise TypeError(
            f"{type(producer).__name__}.to_message() needs bytes values, got "
            f"{type(value).__name__}: drop value_deserializer and decode in the handler"
        )


def _plain(fields: dict[str, Any]) -> Message:
    return Message(**fields)


class RecordMessage(Message):
    """A ``Message`` whose fields are read from a ``ConsumerRecord``.

    ``body`` is the value (``b""`` for a tombstone, whose value is ``None``; tell
    them apart with ``message.raw.value is None``), ``key`` the key, ``headers``
    the record headers as a dict, built once on first access (for a header name
    that occurs more than once the last value wins; every value is in
    ``message.raw.headers``), ``id`` ``"<topic>/<partition>/<offset>"``, ``lane``
    the ``TopicPartition``, ``attempt`` the delivery count of this offset (the
    adapter counts it: Kafka keeps none) and ``raw`` the record.
    """

    __slots__ = ("_attempt", "_headers", "_lane", "_record")
    _attempt: int
    _headers: Mapping[str, bytes]
    _lane: Hashable
    _record: Any

    def __new__(cls, **fields: Any) -> Message:  # type: ignore[misc]
        # Only ``dataclasses.replace`` and friends call the class: they get a plain
        # Message. Records are wrapped with :func:`wrap`.
        return Message(**fields)

    def __reduce__(self) -> tuple[Any, ...]:
        return _plain, ({name: getattr(self, name) for name in _FIELDS},)

    @property
    def key(self) -> bytes | None:
        key: bytes | None = self._record.key
        return key

    @property
    def headers(self) -> Mapping[str, bytes]:
        if not self._record.headers:  # most records: no dict to build, no exception to catch
            return _NO_HEADERS
        try:
            headers: Mapping[str, bytes] = self._headers
        except AttributeError:
            raw = self._record.headers
            headers = dict(raw) if raw else {}
            _set_headers(self, headers)
        return headers

    @property
    def id(self) -> str:
        record = self._record
        return f"{record.topic}/{record.partition}/{record.offset}"

    @property
    def lane(self) -> Hashable:
        lane: Hashable = self._lane
        return lane

    @property
    def attempt(self) -> int:
        attempt: int = self._attempt
        return attempt

    @property
    def raw(self) -> Any:
        return self._record

    @property
    def value(self) -> Any:
        return None  # decode= hands a handler a plain Message copy with its value


_FIELDS = ("body", "id", "key", "headers", "lane", "attempt", "raw", "value")
# The slots' own setters: a frozen dataclass refuses ``setattr``, and these are
# the cheapest way past it (three calls per record).
# ``body`` is Message's own slot, set once per record: every handler reads it, so a
# plain slot read beats a property call per handler.
_set_body = inspect.getattr_static(Message, "body").__set__  # the slot, wherever defined
_set_record = RecordMessage.__dict__["_record"].__set__
_set_lane = RecordMessage.__dict__["_lane"].__set__
_set_attempt = RecordMessage.__dict__["_attempt"].__set__
_set_headers = RecordMessage.__dict__["_headers"].__set__


def wrap(record: Any, lane: Hashable, attempt: int) -> RecordMessage:
    message: RecordMessage = _new(RecordMessage)
    value = record.value
    _set_body(message, b"" if value is None else value)
    _set_record(message, record)
    _set_lane(message, lane)
    _set_attempt(message, attempt)
    return message


def wrap_all(
    producer: object, records: Sequence[Any], lane: Hashable, deliveries: Sequence[Any]
) -> list[Message]:
    """One message per record of a partition's fetch (``check_value`` for each), its
    attempt read from its delivery."""
    for record in records:
        value = record.value
        if value is not None and type(value) is not bytes:
            check_value(producer, value)
    return [
        wrap(record, lane, delivery.attempt)
        for record, delivery in zip(records, deliveries, strict=True)
    ]
