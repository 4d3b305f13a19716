"""docs/getting-started.md#typed-payloads: ``decode=`` hands a handler the decoded body on
``message.value``; a body that does not decode is rejected for that handler (never retried,
never handed to it); handlers sharing a decoder decode each message once; a replayed copy
meant for one handler is acked unseen by the others (docs/dead-letters.md#replay)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec
import pydantic
import pytest

from ackgate import AdvanceOutcome, Message, Reject, Service
from ackgate.testing import ScriptedProducer


class Order(pydantic.BaseModel):
    id: int
    amount: float


class OrderStruct(msgspec.Struct):
    id: int
    amount: float


class HeaderProducer(ScriptedProducer):
    """Scripted events whose payload is ``(name, headers)``, with a dead-letter destination."""

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        name, headers = broker_payload
        return Message(body=raw_event, id=name, headers=headers, attempt=1)

    def dead_letter_destination(self) -> str:
        return "the test's outcomes"


def outcomes(producer: ScriptedProducer) -> dict[str, AdvanceOutcome]:
    return {item.broker_payload[0]: item.outcome for batch in producer.batches for item in batch}


async def drain(service: Service, producer: ScriptedProducer, running: Any, count: int) -> None:
    async with running(service), producer.advanced:
        await producer.advanced.wait_for(lambda: len(outcomes(producer)) >= count)


def feed(producer: HeaderProducer, bodies: list[bytes], headers: Mapping[str, bytes] = {}) -> None:
    for index, body in enumerate(bodies):
        producer.feed(body, (f"m{index}", dict(headers)))


GOOD = b'{"id": 1, "amount": 2.5}'
BAD = b'{"id": "not a number"}'


@pytest.mark.parametrize("model", [Order, OrderStruct], ids=["pydantic", "msgspec"])
async def test_a_model_decodes_the_body_and_a_bad_body_is_rejected_once_never_handed(
    model: type[Any], running: Any
) -> None:
    producer = HeaderProducer()
    feed(producer, [GOOD, BAD, b"not json"])
    service = Service("k", producer=lambda: producer)
    values: list[Any] = []
    raw: list[bytes] = []

    @service.handler("typed", decode=model)
    async def typed(message: Message[Any]) -> None:
        values.append(message.value)

    @service.handler("bytes")
    async def untyped(message: Message) -> None:
        raw.append(message.body)
        assert message.value is None

    await drain(service, producer, running, 3)
    assert values == [model(id=1, amount=2.5)]
    assert raw == [GOOD, BAD, b"not json"]
    done = outcomes(producer)
    assert done["m0"] == AdvanceOutcome(acked=2, failed=0, rejected=0)
    for name in ("m1", "m2"):
        assert (done[name].acked, done[name].rejected, done[name].failed) == (1, 1, 0)
        (reason,) = done[name].reasons
        assert reason.startswith(f"typed: decode={model.__qualname__} failed: ")
        assert "Error" in reason and "\n" not in reason
    stats = service.stats().handlers["typed"]
    assert (stats.handled, stats.rejected, stats.failed, stats.retried) == (1, 2, 0, 0)


async def test_handlers_sharing_a_decoder_decode_each_message_once(running: Any) -> None:
    producer = HeaderProducer()
    feed(producer, [b'{"n": 1}', b'{"n": 2}', b"{"])
    calls: list[bytes] = []

    def decode(body: bytes) -> dict[str, int]:
        calls.append(body)
        return dict(json.loads(body))

    service = Service("k", producer=lambda: producer, decode=decode)
    seen: dict[str, list[Any]] = {"a": [], "b": [], "c": []}

    @service.handler("a")
    async def a(message: Message[dict[str, int]]) -> None:
        seen["a"].append(message.value["n"])

    @service.handler("b", batch_size=10, batch_wait=0.01)
    async def b(messages: list[Message[dict[str, int]]]) -> None:
        seen["b"].extend(message.value["n"] for message in messages)

    @service.handler("c", decode=None)
    async def c(message: Message) -> None:
        seen["c"].append(message.value)

    await drain(service, producer, running, 3)
    assert sorted(calls) == sorted([b'{"n": 1}', b'{"n": 2}', b"{"])  # once each, a and b
    assert seen == {"a": [1, 2], "b": [1, 2], "c": [None, None, None]}
    assert outcomes(producer)["m2"].rejected == 2


async def test_a_replay_for_one_handler_or_service_is_acked_unseen_by_the_others(
    running: Any,
) -> None:
    producer = HeaderProducer()
    replayed = {"ackgate.replayed": b"1"}
    producer.feed(b"again", ("replayed", {**replayed, "ackgate.replay-to": b"notifier"}))
    producer.feed(b"fresh", ("fresh", {}))
    producer.feed(b"theirs", ("theirs", {**replayed, "ackgate.replay-service": b"billing"}))
    producer.feed(b"ours", ("ours", {**replayed, "ackgate.replay-service": b"k"}))
    calls: dict[str, int] = {"store": 0, "notifier": 0, "audit": 0}

    service = Service("k", producer=lambda: producer)

    @service.handler("store")
    async def store(message: Message) -> None:
        calls["store"] += 1

    @service.handler("notifier")
    async def notifier(message: Message) -> None:
        calls["notifier"] += 1

    @service.handler("audit", batch_size=5, batch_wait=0.01)
    async def audit(messages: list[Message]) -> None:
        calls["audit"] += len(messages)

    await drain(service, producer, running, 4)
    # "again" to the notifier only; "theirs" for another service's handlers only.
    assert calls == {"store": 2, "notifier": 3, "audit": 2}
    assert outcomes(producer) == {
        name: AdvanceOutcome(acked=3, failed=0, rejected=0)
        for name in ("replayed", "fresh", "theirs", "ours")
    }


def test_decode_must_be_a_callable_or_a_model() -> None:
    service = Service("k", producer=ScriptedProducer)
    with pytest.raises(TypeError, match=r"handler 'h': decode must be a callable"):

        @service.handler("h", decode=42)
        async def h(message: Message) -> None:
            pass

    with pytest.raises(TypeError, match=r"service 'k2': decode must be a callable"):
        Service("k2", producer=ScriptedProducer, decode="json")


def test_a_decode_rejection_is_a_reject_raised_by_the_decoder() -> None:
    from ackgate._service.decode import check_decoder

    decoder = check_decoder("h", Order)
    assert decoder is not None
    message = Message(body=BAD, id="x")
    with pytest.raises(Reject, match=r"decode=Order failed: ValidationError: "):
        decoder.decoded(message)
