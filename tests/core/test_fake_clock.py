"""docs/testing.md#fakeclock: moving a ``FakeClock`` fires every ack timeout that falls due,
then."""

from __future__ import annotations

import asyncio

import pytest

from ackgate import AckTimeout, AdvanceOutcome, SharedStreamManager
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import outcomes


async def test_advance_fires_due_timeouts_without_a_pull_or_broadcast(clock: FakeClock) -> None:
    producers = [ScriptedProducer(), ScriptedProducer()]
    async with SharedStreamManager(clock=clock, ack_timeout=10.0) as manager:
        subs = []
        for key, producer in zip("ab", producers, strict=True):
            producer.feed("e", 0)
            sub = manager.subscribe(key, "s", producer=lambda p=producer: p)  # type: ignore[misc]
            await anext(sub)  # on the event, never moves on
            subs.append(sub)
        clock.advance(9.0)
        await asyncio.sleep(0)
        assert [s.failed_subscribers for s in manager.stats()] == [0, 0]
        clock.advance(1.0)  # due now, in both groups
        await asyncio.sleep(0)  # one loop turn: that is all a test awaits
        assert [s.failed_subscribers for s in manager.stats()] == [1, 1]
        for producer in producers:
            await producer.wait_advanced(1)
            assert outcomes(producer) == {0: AdvanceOutcome(0, 1, 0)}
        for sub in subs:
            with pytest.raises(AckTimeout):
                await anext(sub)
            await sub.aclose()


async def test_a_due_output_confirmation_fires_too(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    producer.feed("b", 1)
    async with SharedStreamManager(clock=clock, ack_timeout=5.0) as manager:
        sub = manager.subscribe("k", "s", producer=lambda: producer)
        await anext(sub)
        assert sub.bind() is not None  # never confirmed
        await anext(sub)
        clock.advance(5.0)
        await asyncio.sleep(0)
        assert sub._failure is not None
        await producer.wait_advanced(2)
        await sub.aclose()
    assert outcomes(producer) == {0: AdvanceOutcome(0, 1, 0), 1: AdvanceOutcome(0, 1, 0)}


async def test_the_timer_rearms_for_the_next_event(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock, ack_timeout=10.0) as manager:
        fast = manager.subscribe("k", "fast", producer=lambda: producer)
        slow = manager.subscribe("k", "slow", producer=lambda: producer)
        producer.feed("a", 0)
        await anext(fast)
        await anext(slow)
        clock.advance(6.0)
        producer.feed("b", 1)
        await anext(slow)  # "a" acked by slow; "b" broadcast at 1006
        clock.advance(4.0)  # "a" is due for fast (still on it)
        await asyncio.sleep(0)
        assert fast._failure is not None and slow._failure is None
        clock.advance(5.9)
        await asyncio.sleep(0)
        assert slow._failure is None
        clock.advance(0.1)  # "b" is due for slow
        await asyncio.sleep(0)
        assert slow._failure is not None
        await fast.aclose()
        await slow.aclose()


async def test_sleep_until_wakes_on_advance_only(clock: FakeClock) -> None:
    waiter = asyncio.create_task(clock.sleep_until(clock() + 3.0))
    await asyncio.sleep(0)
    clock.advance(2.0)
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(1.0)
    await asyncio.sleep(0)
    assert waiter.done()
    cancelled = asyncio.create_task(clock.sleep_until(clock() + 1.0))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    clock.advance(0.5)
    assert clock._sleepers == []  # a cancelled waiter is forgotten on the next move
