"""docs/failure-semantics.md#poison-messages poison messages: ``Message.attempt`` counts deliveries,
``give_up_after`` turns a failure at that attempt into a reject (dead-lettered, the stream moves
on), a message handed past it without ever being resolved is given up without a call, and a service
whose producer cannot dead-letter refuses to start with the option set."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from ackgate import AdvanceOutcome, Message, Redelivery, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing import FakeClock, ScriptedProducer


class CountedProducer(ScriptedProducer):
    """Scripted events whose payload is ``(name, attempt)``, and a dead-letter
    destination (the test reads the rejects from the advanced outcomes)."""

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        name, attempt = broker_payload
        return Message(body=raw_event, id=name, attempt=attempt)

    def dead_letter_destination(self) -> str:
        return "the test's outcomes"


#: Redeliveries to the failing handler without a noticeable wait.
QUICKLY = Redelivery(backoff=0.01, max_backoff=0.02)


def outcomes(producer: ScriptedProducer) -> dict[str, AdvanceOutcome]:
    return {item.broker_payload[0]: item.outcome for batch in producer.batches for item in batch}


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_give_up_after_is_an_int_of_at_least_1_or_none(value: object) -> None:
    service = Service("k", producer=ScriptedProducer)
    with pytest.raises(ValueError, match=r"handler 'h': give_up_after must be"):

        @service.handler("h", give_up_after=value)  # type: ignore[arg-type]
        async def h(message: Message) -> None:
            pass


async def test_a_message_that_always_fails_is_dead_lettered_after_give_up_after_attempts(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(8)
    service = Service("orders", producer=memory_producer, redelivery=QUICKLY)
    attempts: list[int | None] = []
    picked: set[bytes] = set()
    others: list[bytes] = []

    @service.handler("picky", give_up_after=3)
    async def picky(message: Message) -> None:
        if message.body == b"m5":
            attempts.append(message.attempt)
            raise ValueError("bad row")
        picked.add(message.body)

    @service.handler("other")
    async def other(message: Message) -> None:
        others.append(message.body)

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await broker.wait_drained("orders", "svc")
    assert attempts == [1, 2, 3]
    dead = broker.records("orders.dlq")
    assert [record.value for record in dead] == [b"m5"]
    assert dead[0].reason == (
        "rejected by 1 of 2 subscribers; picky: gave up after 3 attempts: ValueError: bad row"
    )
    everything = {b"m%d" % n for n in range(8)}
    # The handler that acked m5 was never handed it again: no broker redelivery.
    assert sorted(others) == sorted(everything) and picked == everything - {b"m5"}
    stats = service.stats().handlers["picky"]
    assert (stats.handled, stats.failed, stats.gave_up, stats.rejected) == (7, 2, 1, 0)
    failures = [r for r in caplog.records if r.name == "ackgate.service"]
    lines = [r.getMessage() for r in failures]
    again = "handed to this handler again"
    assert any("id=orders/1/1 (attempt 1)" in line and again in line for line in lines)
    assert any("id=orders/1/1 (attempt 2)" in line and again in line for line in lines)
    assert any("gave up on message id=orders/1/1 (attempt 3)" in line for line in lines)
    # A traceback with the first failure of the message only.
    assert [r.exc_info is not None for r in failures] == [True, False, False]


async def test_without_give_up_after_attempt_counts_up_and_every_failure_names_it(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(1)
    service = Service("orders", producer=memory_producer, redelivery=QUICKLY)
    attempts: list[int | None] = []

    @service.handler("flaky")
    async def flaky(message: Message) -> None:
        attempts.append(message.attempt)
        if len(attempts) < 4:
            raise ConnectionError("database unavailable")

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await broker.wait_drained("orders", "svc")
    assert attempts == [1, 2, 3, 4]
    assert broker.records("orders.dlq") == []
    failures = [r.getMessage() for r in caplog.records if "failed on" in r.getMessage()]
    assert [f"(attempt {n})" in line for n, line in zip((1, 2, 3), failures, strict=True)] == [
        True
    ] * 3


async def test_a_message_handed_past_give_up_after_is_given_up_without_a_call(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    producer = CountedProducer()
    producer.feed(b"crashed the process 3 times", ("x", 4))
    producer.feed(b"failed twice before", ("y", 3))
    service = Service("k", producer=lambda: producer)
    called: list[str] = []

    @service.handler("h", give_up_after=3)
    async def h(message: Message) -> None:
        called.append(message.id)

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await producer.wait_advanced(2)
    assert called == ["y"]
    seen = outcomes(producer)
    assert seen["y"] == AdvanceOutcome(acked=1, failed=0, rejected=0)
    assert seen["x"].rejected == 1 and seen["x"].reasons == (
        "h: gave up after 3 attempts: not resolved by any of them "
        "(the process stopped or the call was cut short each time)",
    )
    stats = service.stats().handlers["h"]
    assert (stats.handled, stats.gave_up, stats.rejected, stats.failed) == (1, 1, 0, 0)
    assert any(
        "gives up on message id=x (attempt 4, give_up_after=3) without calling it" in r.message
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


async def test_a_failed_batch_is_judged_per_message_by_its_own_attempt(running: Any) -> None:
    producer = CountedProducer()
    for name, attempt in (("fresh", 1), ("due", 2), ("past", 3)):
        producer.feed(name.encode(), (name, attempt))
    service = Service("k", producer=lambda: producer, redelivery=QUICKLY)
    calls: list[list[str]] = []

    @service.handler("bulk", batch_size=3, batch_wait=60.0, give_up_after=2)
    async def bulk(messages: list[Message]) -> None:
        calls.append([m.id for m in messages])
        raise RuntimeError("boom")

    async with running(service):
        await producer.wait_advanced(3)
    # "past" was delivered twice before: left out; "fresh" is handed again, alone.
    assert calls == [["fresh", "due"], ["fresh"]]
    seen = outcomes(producer)
    for name in ("fresh", "due"):
        assert seen[name].reasons == ("bulk: gave up after 2 attempts: RuntimeError: boom",)
    assert seen["past"].rejected == 1
    assert seen["past"].reasons[0].startswith("bulk: gave up after 2 attempts: not resolved")
    stats = service.stats().handlers["bulk"]
    assert (stats.failed, stats.gave_up, stats.handled) == (1, 3, 0)


async def test_a_handler_that_hangs_on_a_message_gives_up_on_it_once_past_the_limit(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
) -> None:
    """A hang never *fails* the message: the ack timeout cuts it short and it comes
    back (the memory broker counts its deliveries across producers, as SQS would).
    Past ``give_up_after`` deliveries it is given up without a call, and the stream
    moves on."""
    publish(3)
    clock = FakeClock()
    service = Service("orders", producer=memory_producer, ack_timeout=10.0, clock=clock)
    hangs: list[int | None] = []
    handled: list[bytes] = []
    hung = asyncio.Event()

    @service.handler("stuck", give_up_after=2)
    async def stuck(message: Message) -> None:
        if message.body != b"m0":
            handled.append(message.body)
            return
        hangs.append(message.attempt)
        hung.set()
        await asyncio.Event().wait()  # only the ack timeout ends it

    @service.handler("other")  # keeps the group up while "stuck" is subscribed again
    async def other(message: Message) -> None:
        pass

    async with running(service):
        for _ in range(2):
            await hung.wait()
            hung.clear()
            clock.advance(11.0)
        await broker.wait_drained("orders", "svc")
    assert hangs == [1, 2]
    assert sorted(handled) == [b"m1", b"m2"]
    (dead,) = broker.records("orders.dlq")
    assert dead.value == b"m0"
    assert dead.reason == (
        "rejected by 1 of 2 subscribers; stuck: gave up after 2 attempts: not resolved by "
        "any of them (the process stopped or the call was cut short each time)"
    )
    assert service.stats().handlers["stuck"].gave_up == 1


async def test_a_service_giving_up_without_a_dead_letter_destination_refuses_to_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = ScriptedProducer()  # advance() stores rejects nowhere
    producer.feed(b"x", "p0")
    service = Service("k", producer=lambda: producer, restart_backoff=0.0)

    @service.handler("fine")
    async def fine(message: Message) -> None:
        pass

    @service.handler("picky", give_up_after=5)
    async def picky(message: Message) -> None:
        pass

    with pytest.raises(ValueError, match=r"handler 'picky' sets give_up_after=5, but the pro"):
        async with asyncio.timeout(10):
            await service.run()
    assert service.stats().restarts == 0  # refused once, never retried
    assert producer.opened == 0 and producer.batches == []
