"""Subscription.pull_bound (bulk pull-and-bind) and Subscription.wait_failed: what a
subscriber that batches or runs events concurrently needs from the core."""

from __future__ import annotations

import asyncio

import pytest

from ackgate import AckTimeout, AdvanceOutcome, SharedStreamManager, StreamTerminated
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import fed, outcomes, turn


async def test_pull_bound_hands_out_what_is_queued_with_one_ticket_each(
    manager: SharedStreamManager,
) -> None:
    producer = fed(5)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        first = await sub.pull_bound(3)
        assert [raw for raw, _ in first] == ["e0", "e1", "e2"]
        rest = await sub.pull_bound(10)  # only what is queued: no waiting for more
        assert [raw for raw, _ in rest] == ["e3", "e4"]
        seqs = [seq for _, seq in first + rest]
        assert len(set(seqs)) == 5
        manager.confirm_persisted(seqs[:4])
        await producer.wait_advanced(4)  # the windows of e0..e3 are closed
        extra = sub.bind()  # the window is open on e4, the last one
        assert extra is not None
        manager.confirm_persisted([*seqs[4:], extra])
    await producer.wait_advanced(5)  # ... and closes when leaving cleanly
    assert all(o == AdvanceOutcome(1, 0, 0) for o in outcomes(producer).values())


async def test_pull_bound_waits_for_the_first_event_and_cancelling_changes_nothing(
    manager: SharedStreamManager,
) -> None:
    producer = ScriptedProducer()
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        waiting = asyncio.create_task(sub.pull_bound(4))
        await turn()
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        producer.feed("late", 0)
        ((raw, seq),) = await sub.pull_bound(4)
        assert raw == "late"
        manager.confirm_persisted([seq])
    assert outcomes(producer) == {0: AdvanceOutcome(1, 0, 0)}


async def test_pulled_tickets_resolve_each_event_alone(manager: SharedStreamManager) -> None:
    producer = fed(3)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        (_, a), (_, b), (_, c) = await sub.pull_bound(3)
        manager.reject_bound([b], reason="torn")
        manager.fail_bound([c])
        manager.confirm_persisted([a])
        await producer.wait_advanced(3)
    assert outcomes(producer) == {
        0: AdvanceOutcome(1, 0, 0),
        1: AdvanceOutcome(0, 0, 1, ("s: torn",)),
        2: AdvanceOutcome(0, 1, 0),
    }


async def test_a_crash_fails_the_last_event_and_the_timeout_fails_the_rest(
    manager: SharedStreamManager, clock: FakeClock
) -> None:
    producer = fed(3)
    other = manager.subscribe("k", "other", producer=lambda: producer)
    with pytest.raises(RuntimeError, match="crash"):
        async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
            await sub.pull_bound(3)
            raise RuntimeError("crash")
    for _ in range(3):
        await anext(other)
    moved_on = asyncio.create_task(anext(other))  # "other" is done with all three
    await turn()
    # e0, e1 wait for the crashed one's tickets (docs/concepts.md#window)
    assert producer.batches == []
    clock.advance(61.0)
    await producer.wait_advanced(3)
    assert all(o == AdvanceOutcome(1, 1, 0) for o in outcomes(producer).values())
    moved_on.cancel()
    await other.aclose()


async def test_a_force_fail_fails_every_pulled_event_and_the_next_pull_raises(
    manager: SharedStreamManager, clock: FakeClock
) -> None:
    producer = fed(4)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        pulled = await sub.pull_bound(2)
        clock.advance(61.0)
        await producer.wait_advanced(4)
        manager.confirm_persisted(seq for _, seq in pulled)  # stale: nothing changes
        with pytest.raises(AckTimeout):
            await sub.pull_bound(2)
    assert all(o == AdvanceOutcome(0, 1, 0) for o in outcomes(producer).values())


async def test_pull_bound_raises_when_the_group_ended(manager: SharedStreamManager) -> None:
    producer = fed(1)
    producer.end()
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        with pytest.raises(StreamTerminated):
            while True:
                for _, seq in await sub.pull_bound(8):
                    manager.confirm_persisted([seq])


async def test_pull_bound_arguments(manager: SharedStreamManager) -> None:
    producer = fed(1)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="max_events"):
                await sub.pull_bound(bad)  # type: ignore[arg-type]

    async def source():  # type: ignore[no-untyped-def]
        yield "x"

    async with manager.subscribe("fast", "s", source=source) as fast:
        with pytest.raises(RuntimeError, match="ack-mode"):
            await fast.pull_bound(1)


async def test_wait_failed_returns_the_ack_timeout_of_a_subscriber_not_pulling(
    manager: SharedStreamManager, clock: FakeClock
) -> None:
    producer = fed(2)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        await sub.pull_bound(1)  # held, never resolved, and no further pull
        watch = asyncio.create_task(sub.wait_failed())
        await turn()
        assert not watch.done()
        clock.advance(61.0)
        error = await watch
        assert isinstance(error, AckTimeout)
        assert isinstance(await sub.wait_failed(), AckTimeout)  # at once from now on
        with pytest.raises(AckTimeout):
            await anext(sub)


async def test_wait_failed_returns_when_the_group_ends(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer()
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        watch = asyncio.create_task(sub.wait_failed())
        await turn()
        producer.fail(OSError("broker gone"))
        error = await watch
        assert isinstance(error, StreamTerminated)
        assert isinstance(error.__cause__, OSError)


async def test_wait_failed_cancelled_changes_nothing_and_left_is_an_error(
    manager: SharedStreamManager,
) -> None:
    producer = fed(1)
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    watch = asyncio.create_task(sub.wait_failed())
    await turn()
    watch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watch
    assert await anext(sub) == "e0"
    watch = asyncio.create_task(sub.wait_failed())
    await turn()
    await sub.aclose()
    with pytest.raises(RuntimeError, match="was left"):
        await watch
