"""docs/production.md#service-options batch handlers: up to batch_size messages in stream order,
batch_wait after the first at the latest; None acks all, a dict rejects some, Reject rejects all,
other exceptions retry the batch, then fail all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ackgate import AdvanceOutcome, Message, Redelivery, Reject, Retry, Service
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing import ScriptedProducer

#: A redelivery backoff past half the ack timeout: a failed message is failed to the
#: broker, which redelivers it (docs/failure-semantics.md#redelivery-to-the-failing-handler).
BROKER_REDELIVERS = Redelivery(backoff=1e3, max_backoff=1e3)


def outcomes(producer: ScriptedProducer) -> dict[Any, AdvanceOutcome]:
    return {item.broker_payload: item.outcome for batch in producer.batches for item in batch}


async def test_batches_are_at_most_batch_size_in_stream_order(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
) -> None:
    publish(12)
    service = Service("orders", producer=memory_producer)
    batches: list[list[bytes]] = []

    @service.handler("bulk", batch_size=4, batch_wait=60.0)
    async def bulk(messages: list[Message]) -> None:
        batches.append([m.body for m in messages])

    async with running(service):
        await broker.wait_drained("orders", "svc")
    # Round-robin over 4 partitions: the stream order is m0, m1, m2, ...
    assert batches == [[b"m%d" % n for n in range(k, k + 4)] for k in (0, 4, 8)]
    assert service.stats().handlers["bulk"].handled == 12


async def test_a_partial_batch_is_called_batch_wait_after_its_first_message(
    running: Any,
) -> None:
    scripted = ScriptedProducer()
    for n in range(3):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted)
    called = asyncio.Event()
    sizes: list[int] = []

    @service.handler("bulk", batch_size=100, batch_wait=0.05)
    async def bulk(messages: list[Message]) -> None:
        sizes.append(len(messages))
        called.set()

    async with running(service):
        await called.wait()
        await scripted.wait_advanced(3)
    assert sizes == [3]
    assert all(o.is_clean for o in outcomes(scripted).values())


async def test_a_returned_dict_rejects_some_and_acks_the_rest(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
) -> None:
    publish(8)
    service = Service("orders", producer=memory_producer)

    @service.handler("bulk", batch_size=8, batch_wait=60.0)
    async def bulk(messages: list[Message]) -> dict[str, Reject]:
        return {m.id: Reject(f"odd {m.body!r}") for m in messages if int(m.body[1:]) % 2}

    async with running(service):
        await broker.wait_drained("orders", "svc")
    dead = broker.records("orders.dlq")
    assert sorted(r.value for r in dead) == [b"m1", b"m3", b"m5", b"m7"]
    for record in dead:
        assert record.reason is not None and f"bulk: odd {record.value!r}" in record.reason
    stats = service.stats().handlers["bulk"]
    assert (stats.handled, stats.rejected) == (4, 4)


async def test_raising_reject_rejects_the_whole_batch(running: Any) -> None:
    scripted = ScriptedProducer()
    for n in range(3):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted)

    @service.handler("bulk", batch_size=3, batch_wait=60.0, retry=Retry(attempts=3))
    async def bulk(messages: list[Message]) -> None:
        raise Reject("schema v1")

    async with running(service):
        await scripted.wait_advanced(3)
    for outcome in outcomes(scripted).values():
        assert outcome.rejected == 1 and outcome.reasons == ("bulk: schema v1",)
    assert service.stats().handlers["bulk"].retried == 0


async def test_a_failing_batch_is_retried_then_fails_every_message(running: Any) -> None:
    scripted = ScriptedProducer()
    for n in range(3):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted, redelivery=BROKER_REDELIVERS)
    calls: list[int] = []

    @service.handler(
        "bulk", batch_size=3, batch_wait=60.0, retry=Retry(attempts=2, backoff=0.0, max_backoff=0)
    )
    async def bulk(messages: list[Message]) -> None:
        calls.append(len(messages))
        raise OSError("disk full")

    async with running(service):
        await scripted.wait_advanced(3)
    assert calls == [3, 3]
    assert all(o == AdvanceOutcome(0, 1, 0) for o in outcomes(scripted).values())
    stats = service.stats().handlers["bulk"]
    assert (stats.failed, stats.retried, stats.handled) == (3, 3, 0)


async def test_a_batch_that_succeeds_on_retry_is_acked(running: Any) -> None:
    scripted = ScriptedProducer()
    for n in range(2):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted)
    calls = 0

    @service.handler(
        "bulk", batch_size=2, batch_wait=60.0, retry=Retry(attempts=3, backoff=0.0, max_backoff=0)
    )
    async def bulk(messages: list[Message]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("first try")

    async with running(service):
        await scripted.wait_advanced(2)
    assert all(o.is_clean for o in outcomes(scripted).values())


async def test_a_bad_batch_result_is_a_failure(running: Any) -> None:
    scripted = ScriptedProducer()
    scripted.feed(b"0", 0)
    service = Service("k", producer=lambda: scripted, redelivery=BROKER_REDELIVERS)

    @service.handler("bulk", batch_size=2)
    async def bulk(messages: list[Message]) -> Any:
        return ["not", "a", "dict"]

    async with running(service):
        await scripted.wait_advanced(1)
    assert outcomes(scripted)[0].failed == 1
