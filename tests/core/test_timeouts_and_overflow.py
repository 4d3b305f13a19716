"""docs/concepts.md#window: ack timeout, bounded queues, overflow="block"."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from ackgate import AckTimeout, AdvanceOutcome, SharedStreamManager, SubscriberOverflow
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import outcomes, turn


async def test_ack_timeout_force_fails_a_stuck_subscriber(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    producer = ScriptedProducer(lane=lambda payload: payload)
    async with SharedStreamManager(clock=clock, ack_timeout=10.0) as manager:
        stuck = manager.subscribe("k", "stuck", producer=lambda: producer)
        healthy = manager.subscribe("k", "healthy", producer=lambda: producer)
        producer.feed("secret-0", 0)
        producer.feed("secret-1", 1)
        assert await anext(stuck) == "secret-0"
        assert await anext(healthy) == "secret-0"
        assert await anext(healthy) == "secret-1"
        clock.advance(6.0)
        producer.feed("secret-2", 2)
        assert await anext(healthy) == "secret-2"
        clock.advance(4.0)  # events 0 and 1 are 10 s old now; 2 is 4 s old
        with caplog.at_level(logging.WARNING, logger="ackgate"):
            producer.feed("secret-3", 3)  # the next broadcast notices the expiry
            assert await anext(healthy) == "secret-3"
        with pytest.raises(AckTimeout):
            await anext(stuck)  # events 1 and 2 are queued for it, but not handed out
        await producer.wait_advanced(3)
        for position in (0, 1, 2):
            assert outcomes(producer)[position] == AdvanceOutcome(acked=1, failed=1, rejected=0)
        # It stays a member: not in snapshots, but its id is taken.
        with pytest.raises(ValueError, match="already subscribed"):
            manager.subscribe("k", "stuck", producer=lambda: producer)
        [stats] = manager.stats()
        assert (stats.subscribers, stats.failed_subscribers) == (1, 1)
        await healthy.aclose()
        await producer.wait_advanced(4)
        assert outcomes(producer)[3] == AdvanceOutcome(1, 0, 0)  # stuck not in its snapshot
        assert producer.closed == 0  # the failed member still holds the group open
        await stuck.aclose()
        assert producer.closed == 1
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warning.getMessage()
    assert "'stuck'" in message and "'k'" in message and "position=0" in message
    assert "lane=0" in message and "secret" not in message


async def test_ack_timeout_on_the_subscribers_own_pull(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock, ack_timeout=5.0) as manager:
        sub = manager.subscribe("k", "s", producer=lambda: producer)
        producer.feed("a", 0)
        producer.feed("b", 1)
        await anext(sub)
        clock.advance(6.0)
        with pytest.raises(AckTimeout):
            await anext(sub)  # too late to close the window: it timed out first
        with pytest.raises(AckTimeout):
            await anext(sub)  # and it keeps saying so
        await sub.aclose()
    assert outcomes(producer) == {0: AdvanceOutcome(0, 1, 0), 1: AdvanceOutcome(0, 1, 0)}


async def test_ack_timeout_covers_unconfirmed_outputs(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock, ack_timeout=5.0) as manager:
        sub = manager.subscribe("k", "s", producer=lambda: producer)
        producer.feed("a", 0)
        producer.feed("b", 1)
        await anext(sub)
        seq = sub.bind()
        await anext(sub)  # moved past "a", but its output is never confirmed
        clock.advance(5.0)
        producer.feed("c", 2)
        with pytest.raises(AckTimeout):
            await anext(sub)
        manager.confirm_persisted([seq])  # stale now: ignored
        await producer.wait_advanced(3)
        await sub.aclose()
    assert outcomes(producer)[0] == AdvanceOutcome(0, 1, 0)
    assert outcomes(producer)[1] == AdvanceOutcome(0, 1, 0)


async def test_ack_timeout_reaches_a_departed_subscribers_outputs(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock, ack_timeout=5.0) as manager:
        stays = manager.subscribe("k", "stays", producer=lambda: producer)
        gone = manager.subscribe("k", "gone", producer=lambda: producer)
        producer.feed("a", 0)
        await anext(gone)
        gone.bind()
        await gone.aclose()  # left cleanly, its output still unconfirmed
        await anext(stays)
        clock.advance(3.0)
        producer.feed("b", 1)
        await anext(stays)
        await turn()
        assert producer.batches == []
        clock.advance(2.0)
        producer.feed("c", 2)
        await anext(stays)
        await producer.wait_advanced(2)
        await stays.aclose()
    assert outcomes(producer)[0] == AdvanceOutcome(acked=1, failed=1, rejected=0)
    assert outcomes(producer)[1] == AdvanceOutcome(acked=1, failed=0, rejected=0)


async def test_ack_timeout_fires_on_its_own_with_a_real_clock() -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(ack_timeout=0.05) as manager:
        sub = manager.subscribe("k", "s", producer=lambda: producer)
        producer.feed("a", 0)
        await anext(sub)
        await producer.wait_advanced(1)  # the timer force-failed it: nobody pulled
        assert outcomes(producer)[0] == AdvanceOutcome(0, 1, 0)
        with pytest.raises(AckTimeout):
            await anext(sub)
        await sub.aclose()


async def test_overflow_force_fails_the_slow_subscriber_only(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock, subscriber_queue_size=3) as manager:
        slow = manager.subscribe("k", "slow", producer=lambda: producer)
        fast = manager.subscribe("k", "fast", producer=lambda: producer)
        for i in range(6):
            producer.feed(i, i)
        seen = [await anext(fast) for _ in range(6)]
        assert seen == list(range(6))
        with pytest.raises(SubscriberOverflow):
            await anext(slow)
        await producer.wait_advanced(5)
        got = outcomes(producer)
        assert got[2] == AdvanceOutcome(acked=1, failed=1, rejected=0)
        assert got[3] == AdvanceOutcome(acked=1, failed=1, rejected=0)  # the event that overflowed
        assert got[4] == AdvanceOutcome(acked=1, failed=0, rejected=0)  # not in its snapshot
        await slow.aclose()
        await fast.aclose()


async def test_overflow_block_waits_for_room_instead(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(
        clock=clock, subscriber_queue_size=2, overflow="block"
    ) as manager:
        slow = manager.subscribe("k", "slow", producer=lambda: producer)
        fast = manager.subscribe("k", "fast", producer=lambda: producer)
        for i in range(10):
            producer.feed(i, i)
        got_fast = [await anext(fast), await anext(fast)]
        waiting = asyncio.create_task(anext(fast))
        await turn()
        assert not waiting.done()  # the poll waits for the slow one's room

        async def rest_of_fast() -> list[Any]:
            return [await waiting] + [await anext(fast) for _ in range(7)]

        async def all_of_slow() -> list[Any]:
            return [await anext(slow) for _ in range(10)]

        got_slow, rest = await asyncio.gather(all_of_slow(), rest_of_fast())
        assert got_slow == list(range(10))
        assert got_fast + rest == list(range(10))
        await slow.aclose()
        await fast.aclose()
    assert all(o.failed == 0 for o in outcomes(producer).values() if o.acked == 2)


async def test_overflow_block_still_applies_the_ack_timeout(clock: FakeClock) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(
        clock=clock, subscriber_queue_size=1, overflow="block", ack_timeout=5.0
    ) as manager:
        stuck = manager.subscribe("k", "stuck", producer=lambda: producer)
        fast = manager.subscribe("k", "fast", producer=lambda: producer)
        for i in range(3):
            producer.feed(i, i)
        assert await anext(fast) == 0
        assert await anext(stuck) == 0
        assert await anext(fast) == 1
        waiting = asyncio.create_task(anext(fast))
        await turn()
        assert not waiting.done()
        clock.advance(5.0)
        # The stuck subscriber's own pull notices its expiry and frees the poll.
        with pytest.raises(AckTimeout):
            await anext(stuck)
        assert await waiting == 2
        await stuck.aclose()
        await fast.aclose()


async def test_fast_path_overflow_also_bounds_memory(clock: FakeClock) -> None:
    release = asyncio.Event()

    async def source() -> Any:
        for i in range(10):
            yield i
        await release.wait()

    async with SharedStreamManager(clock=clock, subscriber_queue_size=4) as manager:
        slow = manager.subscribe("f", "slow", source=source)
        fast = manager.subscribe("f", "fast", source=source)
        assert [await anext(fast) for _ in range(10)] == list(range(10))
        with pytest.raises(SubscriberOverflow):
            await anext(slow)
        release.set()
        await slow.aclose()
        await fast.aclose()
