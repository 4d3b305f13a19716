"""docs/production.md#service-options stop(timeout): graceful; no new message is handed to a
handler, calls in progress get up to ``timeout``, what finished is advanced, the rest is
redelivered, the producer is closed and run() returns. Cancelling run() is a hard stop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ackgate import AdvanceOutcome, Message, Service
from ackgate.testing import ScriptedProducer


def outcomes(producer: ScriptedProducer) -> dict[Any, AdvanceOutcome]:
    return {item.broker_payload: item.outcome for batch in producer.batches for item in batch}


def three_events() -> ScriptedProducer:
    scripted = ScriptedProducer()  # one lane: "lane" ordering calls them one at a time
    for n in range(3):
        scripted.feed(b"%d" % n, n)
    return scripted


async def test_stop_lets_a_slow_call_finish_and_hands_out_nothing_new() -> None:
    scripted = three_events()
    service = Service("k", producer=lambda: scripted)
    started = asyncio.Event()
    release = asyncio.Event()
    called: list[bytes] = []

    @service.handler("h")
    async def handle(message: Message) -> None:
        called.append(message.body)
        started.set()
        await release.wait()

    async with asyncio.timeout(10):
        run = asyncio.create_task(service.run())
        await started.wait()
        stop = asyncio.create_task(service.stop(timeout=30.0))
        await asyncio.sleep(0)
        assert not stop.done() and service.stats().handlers["h"].in_progress == 1
        release.set()
        await stop
        assert run.done() and run.exception() is None
    assert called == [b"0"]  # nothing new was handed out once stopping
    assert outcomes(scripted) == {
        0: AdvanceOutcome(acked=1, failed=0, rejected=0),  # finished: advanced clean
        1: AdvanceOutcome(acked=0, failed=1, rejected=0),  # left to redelivery
        2: AdvanceOutcome(acked=0, failed=1, rejected=0),
    }
    assert scripted.closed == 1
    assert service.stats().state == "stopped"


async def test_a_stop_reads_nothing_more_from_the_broker() -> None:
    """The group stops polling when the stop begins, not after the handlers' grace:
    a message received meanwhile would reach no handler, and the broker would count
    a delivery for it (an SQS receive, a Pub/Sub delivery attempt) that nobody saw."""
    scripted = ScriptedProducer()
    scripted.feed(b"0", 0)
    service = Service("k", producer=lambda: scripted)
    started = asyncio.Event()
    release = asyncio.Event()

    @service.handler("h")
    async def handle(message: Message) -> None:
        started.set()
        await release.wait()

    async with asyncio.timeout(10):
        run = asyncio.create_task(service.run())
        await started.wait()
        await scripted.starved.wait()  # the poll waits for the broker's next message
        stop = asyncio.create_task(service.stop(timeout=30.0))
        await asyncio.sleep(0)  # the stop begins
        scripted.feed(b"1", 1)  # the broker has more
        scripted.feed(b"2", 2)
        release.set()
        await stop
        await run
    assert outcomes(scripted) == {0: AdvanceOutcome(acked=1, failed=0, rejected=0)}
    assert scripted.stream_closed == 1 and scripted.closed == 1


async def test_a_call_still_running_at_the_deadline_is_cancelled_and_fails() -> None:
    scripted = three_events()
    service = Service("k", producer=lambda: scripted)
    started = asyncio.Event()
    cancelled = False

    @service.handler("h")
    async def handle(message: Message) -> None:
        nonlocal cancelled
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled = True
            raise

    async with asyncio.timeout(10):
        run = asyncio.create_task(service.run())
        await started.wait()
        await service.stop(timeout=0.01)
        await run
    assert cancelled
    assert outcomes(scripted)[0] == AdvanceOutcome(acked=0, failed=1, rejected=0)
    assert scripted.closed == 1
    assert service.stats().handlers["h"].failed == 0  # abandoned, not a handler failure


async def test_cancelling_run_is_a_hard_stop() -> None:
    scripted = three_events()
    service = Service("k", producer=lambda: scripted)
    started = asyncio.Event()
    cancelled = False

    @service.handler("h")
    async def handle(message: Message) -> None:
        nonlocal cancelled
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled = True
            raise

    async with asyncio.timeout(10):
        run = asyncio.create_task(service.run())
        await started.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await service.stop()  # returns at once: run() already ended
    assert cancelled and scripted.closed == 1
    assert outcomes(scripted)[0].failed == 1
    assert service.stats().state == "stopped"


async def test_stats_while_running_and_after() -> None:
    scripted = three_events()
    service = Service("k", producer=lambda: scripted)
    started = asyncio.Event()
    release = asyncio.Event()

    @service.handler("blocked")
    async def blocked(message: Message) -> None:
        started.set()
        await release.wait()

    @service.handler("free", concurrency=2)
    async def free(message: Message) -> None:
        pass

    before = service.stats()
    assert before.state == "new" and before.group is None
    assert before.handlers["blocked"].handled == 0
    async with asyncio.timeout(10):
        run = asyncio.create_task(service.run())
        await started.wait()
        await asyncio.sleep(0)
        stats = service.stats()
        assert stats.state == "running" and stats.restarts == 0
        assert stats.group is not None
        assert (stats.group.key, stats.group.subscribers, stats.group.paused) == ("k", 2, False)
        assert stats.handlers["blocked"].in_progress == 1
        assert list(stats.handlers) == ["blocked", "free"]
        release.set()
        await scripted.wait_advanced(3)
        stats = service.stats()
        assert stats.handlers["blocked"].handled == stats.handlers["free"].handled == 3
        assert stats.handlers["blocked"].in_progress == 0
        assert stats.group is not None and stats.group.advanced_events == 3
        await service.stop()
        await run
    after = service.stats()
    assert after.state == "stopped" and after.group is None
