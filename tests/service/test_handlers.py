"""docs/production.md#service-options per-message handlers: returning acks, Reject rejects (with its
reason, never retried), other exceptions are retried then fail; failures are logged without
bodies."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from ackgate import (
    AdvanceOutcome,
    Message,
    Redelivery,
    Reject,
    Retry,
    Service,
    reject_shared_stream_event,
)
from ackgate._service.calls import _MIN_HELD_MESSAGES
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer
from ackgate.testing import ScriptedProducer

#: A redelivery backoff past half the ack timeout: a failed message is failed to the
#: broker, which redelivers it (docs/failure-semantics.md#redelivery-to-the-failing-handler).
BROKER_REDELIVERS = Redelivery(backoff=1e3, max_backoff=1e3)


def outcomes(producer: ScriptedProducer) -> dict[Any, AdvanceOutcome]:
    return {item.broker_payload: item.outcome for batch in producer.batches for item in batch}


async def test_returning_acks_and_the_event_is_advanced_clean(running: Any) -> None:
    scripted = ScriptedProducer()
    for n in range(3):
        scripted.feed(b"body %d" % n, n)
    service = Service("k", producer=lambda: scripted)
    bodies: list[bytes] = []

    @service.handler("a")
    async def a(message: Message) -> None:
        bodies.append(message.body)

    @service.handler("b", concurrency=3, ordering="none")
    async def b(message: Message) -> None:
        pass

    async with running(service):
        await scripted.wait_advanced(3)
    assert bodies == [b"body 0", b"body 1", b"body 2"]
    assert all(
        o == AdvanceOutcome(acked=2, failed=0, rejected=0) for o in outcomes(scripted).values()
    )
    assert scripted.closed == 1


async def test_a_retried_handler_succeeds_on_attempt_3(running: Any) -> None:
    scripted = ScriptedProducer()
    scripted.feed(b"flaky", "p0")
    service = Service("k", producer=lambda: scripted)
    calls = 0

    @service.handler("h", retry=Retry(attempts=3, backoff=0.0, max_backoff=0.0))
    async def handle(message: Message) -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("database unavailable")

    @service.handler("other")
    async def other(message: Message) -> None:
        pass

    async with running(service):
        await scripted.wait_advanced(1)
        stats = service.stats().handlers["h"]
    assert calls == 3
    assert outcomes(scripted)["p0"].is_clean
    assert (stats.handled, stats.retried, stats.failed, stats.rejected) == (1, 2, 0, 0)


async def test_exhausted_retries_fail_the_event_and_log_without_the_body(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = ScriptedProducer()
    scripted.feed(b"secret body", "p0")
    scripted.feed(b"fine", "p1")
    service = Service("k", producer=lambda: scripted, redelivery=BROKER_REDELIVERS)

    @service.handler("h", retry=Retry(attempts=2, backoff=0.0, max_backoff=0.0))
    async def handle(message: Message) -> None:
        if message.body.startswith(b"secret"):
            raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger="ackgate.service"):
        async with running(service):
            await scripted.wait_advanced(2)
            stats = service.stats().handlers["h"]
    assert outcomes(scripted)["p0"] == AdvanceOutcome(acked=0, failed=1, rejected=0)
    assert outcomes(scripted)["p1"].is_clean
    assert (stats.handled, stats.failed, stats.retried) == (1, 1, 1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # the retry, then the failure
    for record in warnings:
        text = record.getMessage()
        assert "'h'" in text and "id='p0'" in text and "boom" in text
    assert "secret" not in caplog.text


async def test_reject_is_never_retried_and_its_reason_reaches_the_outcome(running: Any) -> None:
    scripted = ScriptedProducer()
    scripted.feed(b"torn", "p0")
    service = Service("k", producer=lambda: scripted)
    calls = 0

    @service.handler("auditor", retry=Retry(attempts=5, backoff=0.0, max_backoff=0.0))
    async def audit(message: Message) -> None:
        nonlocal calls
        calls += 1
        raise Reject("not JSON")

    @service.handler("indexer")
    async def index(message: Message) -> None:
        pass

    async with running(service):
        await scripted.wait_advanced(1)
        stats = service.stats().handlers["auditor"]
    assert calls == 1
    outcome = outcomes(scripted)["p0"]
    assert (outcome.acked, outcome.rejected, outcome.failed) == (1, 1, 0)
    assert outcome.reasons == ("auditor: not JSON",)
    assert (stats.rejected, stats.retried) == (1, 0)


async def test_a_rejected_message_reaches_the_dead_letter_record_with_its_reason(
    broker: MemoryBroker,
    memory_producer: Callable[[], MemoryStreamProducer],
    publish: Callable[..., list[Any]],
    running: Any,
) -> None:
    positions = publish(10)
    service = Service("orders", producer=memory_producer)

    @service.handler("auditor")
    async def audit(message: Message) -> None:
        if message.body == b"m3":
            raise Reject("torn order")

    @service.handler("indexer", concurrency=4)
    async def index(message: Message) -> None:
        pass

    async with running(service):
        await broker.wait_drained("orders", "svc")
    (dead,) = broker.records("orders.dlq")
    assert dead.value == b"m3" and dead.origin == positions[3]
    assert dead.reason is not None and "auditor: torn order" in dead.reason


async def test_handlers_run_while_others_are_slow(running: Any) -> None:
    """A handler's calls do not wait for another handler's."""
    scripted = ScriptedProducer()
    for n in range(5):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted)
    release = asyncio.Event()
    fast_done = asyncio.Event()
    fast: list[bytes] = []

    @service.handler("slow")
    async def slow(message: Message) -> None:
        await release.wait()

    @service.handler("fast")
    async def quick(message: Message) -> None:
        fast.append(message.body)
        if len(fast) == 5:
            fast_done.set()

    async with running(service):
        await fast_done.wait()
        assert scripted.batches == []  # nothing advanced while "slow" is on the first
        release.set()
        await scripted.wait_advanced(5)


async def test_reject_shared_stream_event_from_a_handler_rejects_nothing(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Handler calls do not run in the feed's context: the core's module-level reject
    cannot hit whatever event the feed happens to be on. Handlers raise Reject."""
    scripted = ScriptedProducer()
    for n in range(3):
        scripted.feed(b"%d" % n, n)
    service = Service("k", producer=lambda: scripted)

    @service.handler("h", concurrency=3, ordering="none")
    async def handle(message: Message) -> None:
        reject_shared_stream_event()

    async with running(service):
        await scripted.wait_advanced(3)
    assert all(o.is_clean for o in outcomes(scripted).values())
    assert "outside a shared stream window" in caplog.text


async def test_a_failure_is_redelivered_to_the_failing_handler_only(
    running: Any, broker: MemoryBroker, memory_producer: Callable[[], MemoryStreamProducer]
) -> None:
    """docs/concepts.md#redelivery-memory through a Service: the held partition is sought back and
    its records come again, but the healthy handler, which acked them, is not handed them."""
    for n in range(20):
        broker.publish("orders", b"%d" % n, key="one key")  # one partition
    service = Service("orders", producer=memory_producer, redelivery=BROKER_REDELIVERS)
    healthy_bodies: list[bytes] = []
    healthy_done = asyncio.Event()
    failed_once = False

    @service.handler("healthy")
    async def healthy(message: Message) -> None:
        healthy_bodies.append(message.body)
        if len(healthy_bodies) == 20:
            healthy_done.set()

    @service.handler("flaky")
    async def flaky(message: Message) -> None:
        nonlocal failed_once
        if message.body == b"5" and not failed_once:
            failed_once = True
            await healthy_done.wait()  # healthy acked everything before the copies come
            raise ConnectionError("downstream hiccup")

    async with running(service):
        await broker.wait_drained("orders", "svc")
        stats = service.stats()
    assert healthy_bodies == [b"%d" % n for n in range(20)]  # each once: no copy for it
    assert stats.handlers["flaky"].failed == 1
    assert stats.handlers["healthy"].redeliveries_skipped == 15  # the copies of 5..19


async def test_a_handler_behind_the_redelivery_point_is_not_handed_what_it_acked_since(
    running: Any, broker: MemoryBroker, memory_producer: Callable[[], MemoryStreamProducer]
) -> None:
    """docs/concepts.md#redelivery-memory at hand-out: the healthy handler is on message 10 when the
    copies of 5..99 come. It had acked 5..9 (skipped when the copies come); it acks 10..99 only
    after, and a copy it reaches once it acked the original is skipped too. Only the copies it
    pulled while still holding their originals (its read-ahead, at most ``_MIN_HELD_MESSAGES``) are
    handed to it again."""
    count = 100
    for n in range(count):
        broker.publish("orders", b"%d" % n, key="one key")  # one partition
    service = Service("orders", producer=memory_producer, redelivery=BROKER_REDELIVERS)
    healthy_bodies: list[bytes] = []
    copies_came = asyncio.Event()
    flaky_bodies: list[bytes] = []

    @service.handler("healthy")
    async def healthy(message: Message) -> None:
        healthy_bodies.append(message.body)
        if message.body == b"10":
            await copies_came.wait()

    @service.handler("flaky")
    async def flaky(message: Message) -> None:
        flaky_bodies.append(message.body)
        if message.body == b"5":
            if flaky_bodies.count(b"5") == 1:
                raise ConnectionError("downstream hiccup")
            copies_came.set()

    async with running(service):
        await broker.wait_drained("orders", "svc")
        stats = service.stats()
    assert sorted(set(healthy_bodies), key=int) == [b"%d" % n for n in range(count)]
    duplicates = len(healthy_bodies) - count
    assert duplicates <= _MIN_HELD_MESSAGES  # old: every copy of 10..99 (90)
    # Each of the 95 copies was either handed to it or counted as skipped.
    assert stats.handlers["healthy"].redeliveries_skipped == 95 - duplicates
