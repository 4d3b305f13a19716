"""docs/production.md#service-options: Message, to_message (the default and the memory adapter's),
and the service converting each event once, in the poll, before fan-out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar

import pytest

from ackgate import AdvanceItem, Message, Reject, Service, SharedStreamProducer
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer, Record


class BytesProducer(SharedStreamProducer):
    """Implements only what the ABC requires: the default to_message applies."""

    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        raise NotImplementedError

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        raise NotImplementedError

    def get_advance_lane(self, broker_payload: Any) -> Any:
        return broker_payload[0]


def test_default_to_message_takes_bytes() -> None:
    message = BytesProducer().to_message(b"body", ("eu", 7))
    assert message == Message(body=b"body", id="('eu', 7)", lane="eu", raw=b"body")
    assert message.key is None and dict(message.headers) == {} and message.attempt is None


def test_default_to_message_names_the_producer_class() -> None:
    with pytest.raises(TypeError, match=r"BytesProducer yields str raw events.*to_message"):
        BytesProducer().to_message("text", ("eu", 1))


def test_memory_to_message(broker: MemoryBroker) -> None:
    position = broker.publish("orders", b'{"n": 1}', key="alice")
    producer = MemoryStreamProducer(broker, "orders", "svc")
    message = producer.to_message(b'{"n": 1}', position)
    assert message.body == b'{"n": 1}'
    assert message.key == b"alice"
    assert message.id == f"orders/{position.partition}/{position.offset}"
    assert message.lane == position.partition == producer.get_advance_lane(position)
    assert message.attempt == 1 and dict(message.headers) == {}
    assert isinstance(message.raw, Record) and message.raw.value == b'{"n": 1}'


def test_memory_to_message_needs_bytes(broker: MemoryBroker) -> None:
    position = broker.publish("orders", {"n": 1})
    producer = MemoryStreamProducer(broker, "orders", "svc")
    with pytest.raises(TypeError, match=r"holds a dict; a Service reads bytes"):
        producer.to_message({"n": 1}, position)


def test_message_repr_never_shows_the_body() -> None:
    message = Message(body=b"secret card number", id="orders/0/3", lane=0)
    assert "secret" not in repr(message)
    assert repr(message) == "Message(id='orders/0/3', lane=0, attempt=None, body=<18 bytes>)"


def test_reject_reason_is_a_str_or_none() -> None:
    assert Reject("torn").reason == "torn" and Reject().reason is None
    with pytest.raises(TypeError, match="str or None"):
        Reject(42)  # type: ignore[arg-type]


class CountingProducer(MemoryStreamProducer):
    converted: ClassVar[list[str]] = []

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        message = super().to_message(raw_event, broker_payload)
        self.converted.append(message.id)
        return message


async def test_each_event_is_converted_once_for_every_handler(
    broker: MemoryBroker, publish: Callable[..., list[Any]], running: Any
) -> None:
    publish(20)
    CountingProducer.converted = []
    service = Service("orders", producer=lambda: CountingProducer(broker, "orders", "svc"))
    seen: dict[str, list[Message]] = {"a": [], "b": [], "c": []}
    for handler_id, messages in seen.items():

        async def handle(message: Message, messages: list[Message] = messages) -> None:
            messages.append(message)

        service.handler(handler_id)(handle)
    async with running(service):
        await broker.wait_drained("orders", "svc")
    assert sorted(CountingProducer.converted) == sorted(m.id for m in seen["a"])
    assert len(CountingProducer.converted) == 20
    for a, b, c in zip(seen["a"], seen["b"], seen["c"], strict=True):
        assert a is b is c  # one Message object, handed to every handler


class BrokenOnce(MemoryStreamProducer):
    """to_message raises on offset 2 of partition 0 the first time it sees it."""

    failed = False

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        if (broker_payload.partition, broker_payload.offset) == (0, 2) and not BrokenOnce.failed:
            BrokenOnce.failed = True
            raise ValueError("cannot convert")
        return super().to_message(raw_event, broker_payload)


async def test_a_conversion_error_ends_the_group_and_the_restart_redelivers(
    broker: MemoryBroker,
    publish: Callable[..., list[Any]],
    running: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(40)
    BrokenOnce.failed = False
    service = Service(
        "orders", producer=lambda: BrokenOnce(broker, "orders", "svc"), restart_backoff=0.0
    )
    handled: set[str] = set()

    @service.handler("h")
    async def handle(message: Message) -> None:
        handled.add(message.id)

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await broker.wait_drained("orders", "svc")
    assert service.stats().restarts == 1
    assert "ValueError('cannot convert')" in caplog.text
    assert len(handled) == 40  # nothing lost: the unconverted event came again
    assert broker.records("orders.dlq") == []
