"""The bulk paths: ``Subscription.pull_batch`` (one number bound to many events) with
``manager.reject_in_batch``, and producers that yield ``EventBatch`` es. Each event
must resolve, and be advanced, exactly as if it had been pulled and bound alone."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ackgate import (
    AckTimeout,
    AdvanceOutcome,
    EventBatch,
    SharedStreamManager,
    StreamTerminated,
)
from ackgate.testing import FakeClock, ScriptedProducer

from .conftest import fed, outcomes, turn


class BatchingProducer(ScriptedProducer):
    """Yields what it is fed with ``feed_item``: ``EventBatch`` es (or anything else)."""

    def open_stream_batches(self) -> AsyncIterator[Any]:  # type: ignore[override]
        return self.open_stream()


def batch_of(start: int, count: int, lane: Any = None, ids: bool = False) -> EventBatch:
    numbers = range(start, start + count)
    return EventBatch(
        [f"e{n}" for n in numbers],
        list(numbers),
        lane,
        [("id", n) for n in numbers] if ids else None,
    )


# -- pull_batch -------------------------------------------------------------------


async def test_pull_batch_binds_one_number_to_what_is_queued(
    manager: SharedStreamManager,
) -> None:
    producer = fed(5)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        first = await sub.pull_batch(3)
        assert first.events == ["e0", "e1", "e2"]
        rest = await sub.pull_batch(10)  # only what is queued: no waiting for more
        assert rest.events == ["e3", "e4"]
        assert first.seq != rest.seq
        assert sub.bind() is None  # the windows closed at once: nothing is open
        manager.confirm_persisted([rest.seq])
        await turn()
        assert producer.advanced_count == 0  # e0..e2 are not confirmed: the lane holds
        manager.confirm_persisted([first.seq])
        await producer.wait_advanced(5)
    assert outcomes(producer) == {n: AdvanceOutcome(1, 0, 0) for n in range(5)}


async def test_reject_in_batch_rejects_those_events_and_the_rest_ack_on_confirm(
    manager: SharedStreamManager,
) -> None:
    producer = fed(4)
    async with (
        manager.subscribe("k", "a", producer=lambda: producer) as a,
        manager.subscribe("k", "b", producer=lambda: producer) as b,
    ):
        batch = await a.pull_batch(4)
        manager.reject_in_batch(batch.seq, [1, 3], reason="bad row")
        manager.reject_in_batch(batch.seq, [1], reason="again")  # resolved already: no-op
        manager.confirm_persisted([batch.seq])
        other = await b.pull_batch(4)
        manager.confirm_persisted([other.seq])
        await producer.wait_advanced(4)
    result = outcomes(producer)
    assert result[0] == result[2] == AdvanceOutcome(2, 0, 0)
    assert result[1] == result[3] == AdvanceOutcome(1, 0, 1, ("a: bad row",))


async def test_rejecting_every_event_apart_retires_the_number(
    manager: SharedStreamManager,
) -> None:
    producer = fed(2)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        batch = await sub.pull_batch(2)
        manager.reject_in_batch(batch.seq, range(2))
        await producer.wait_advanced(2)
        assert batch.seq not in manager._bindings._by_seq
        manager.confirm_persisted([batch.seq])  # stale now: ignored
    assert outcomes(producer) == {0: AdvanceOutcome(0, 0, 1), 1: AdvanceOutcome(0, 0, 1)}


@pytest.mark.parametrize(
    ("how", "expected"),
    [("fail", AdvanceOutcome(0, 1, 0)), ("reject", AdvanceOutcome(0, 0, 1, ("s: no",)))],
)
async def test_fail_and_reject_bound_resolve_every_event_not_resolved_yet(
    manager: SharedStreamManager, how: str, expected: AdvanceOutcome
) -> None:
    producer = fed(3)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        batch = await sub.pull_batch(3)
        manager.reject_in_batch(batch.seq, [0], reason="zero")
        if how == "fail":
            manager.fail_bound([batch.seq])
        else:
            manager.reject_bound([batch.seq], reason="no")
        manager.confirm_persisted([batch.seq])  # resolved: stale, ignored
        await producer.wait_advanced(3)
    result = outcomes(producer)
    assert result[0] == AdvanceOutcome(0, 0, 1, ("s: zero",))
    assert result[1] == result[2] == expected


async def test_bad_indexes_are_logged_and_ignored(
    manager: SharedStreamManager, caplog: pytest.LogCaptureFixture
) -> None:
    producer = fed(2)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        batch = await sub.pull_batch(2)
        with caplog.at_level(logging.WARNING, logger="ackgate"):
            manager.reject_in_batch(batch.seq, [5, -1, "0", True])
        assert caplog.text.count("reject_in_batch() ignored index") == 4
        manager.reject_in_batch(987654, [0])  # not a live number: ignored
        manager.reject_in_batch("nope", [0])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="iterable of indexes"):
            manager.reject_in_batch(batch.seq, 0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="reason"):
            manager.reject_in_batch(batch.seq, [0], reason=3)  # type: ignore[arg-type]
        manager.confirm_persisted([batch.seq])
        await producer.wait_advanced(2)
    assert outcomes(producer) == {0: AdvanceOutcome(1, 0, 0), 1: AdvanceOutcome(1, 0, 0)}


async def test_reject_in_batch_from_another_thread() -> None:
    producer = fed(2)
    async with (
        SharedStreamManager() as manager,
        manager.subscribe("k", "s", producer=lambda: producer) as sub,
    ):
        batch = await sub.pull_batch(2)
        worker = threading.Thread(target=manager.reject_in_batch, args=(batch.seq, [1], "t"))
        worker.start()
        await asyncio.to_thread(worker.join)
        await turn()
        manager.confirm_persisted([batch.seq])
        await producer.wait_advanced(2)
    assert outcomes(producer)[1] == AdvanceOutcome(0, 0, 1, ("s: t",))


async def test_an_unconfirmed_batch_times_out_and_fails_every_event(
    manager: SharedStreamManager, clock: FakeClock
) -> None:
    producer = fed(3)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        batch = await sub.pull_batch(3)
        manager.reject_in_batch(batch.seq, [2], reason="r")
        clock.advance(61.0)
        await producer.wait_advanced(3)
        with pytest.raises(AckTimeout):
            await anext(sub)
        manager.confirm_persisted([batch.seq])  # too late: stale
    result = outcomes(producer)
    assert result[0] == result[1] == AdvanceOutcome(0, 1, 0)
    assert result[2] == AdvanceOutcome(0, 0, 1, ("s: r",))


async def test_a_batch_outlives_its_subscription_until_confirmed(
    manager: SharedStreamManager,
) -> None:
    producer = fed(3)
    other = manager.subscribe("k", "stays", producer=lambda: producer)
    sub = manager.subscribe("k", "leaves", producer=lambda: producer)
    async with sub:
        batch = await sub.pull_batch(3)
    # Left with an exception or not: the windows are closed; the number decides.
    async with other:
        manager.confirm_persisted([(await other.pull_batch(3)).seq])
        await turn()
        assert producer.advanced_count == 0
        manager.confirm_persisted([batch.seq])
        await producer.wait_advanced(3)
    assert set(outcomes(producer).values()) == {AdvanceOutcome(2, 0, 0)}


async def test_pull_batch_passes_copies_it_acked_before() -> None:
    producer = BatchingProducer()
    producer.feed_item(batch_of(0, 3, ids=True))
    async with (
        SharedStreamManager() as manager,
        manager.subscribe("k", "s", producer=lambda: producer) as sub,
    ):
        first = await sub.pull_batch(3)
        manager.confirm_persisted([first.seq])
        await producer.wait_advanced(3)
        producer.feed_item(batch_of(0, 3, ids=True))  # a redelivery of the same ids
        await producer.wait_advanced(6)  # the copies were counted acked at broadcast
        assert sub.redeliveries_skipped == 3
        producer.feed_item(batch_of(3, 1, ids=True))
        assert (await sub.pull_batch(10)).events == ["e3"]


async def test_pull_batch_checks_its_argument_and_mode(manager: SharedStreamManager) -> None:
    producer = fed(1)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        for bad in (0, -1, True, 1.5):
            with pytest.raises(ValueError, match="max_events"):
                await sub.pull_batch(bad)  # type: ignore[arg-type]

    async def source() -> AsyncIterator[str]:
        yield "x"

    async with manager.subscribe("fast", "s", source=source) as fast:
        with pytest.raises(RuntimeError, match="ack-mode"):
            await fast.pull_batch(1)


# -- producers that yield batches --------------------------------------------------


async def test_batches_are_handed_out_one_event_at_a_time_and_advanced_per_event(
    manager: SharedStreamManager,
) -> None:
    producer = BatchingProducer()
    producer.feed_item(batch_of(0, 3, lane="x"))
    producer.feed_item(batch_of(3, 2, lane="y"))
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        got = [await anext(sub) for _ in range(5)]
        assert got == [f"e{n}" for n in range(5)]
        sub.reject("r")  # on e4
    await producer.wait_advanced(5)
    for batch in producer.batches:
        payloads = [item.broker_payload for item in batch]
        assert set(payloads) <= {0, 1, 2} or set(payloads) <= {3, 4}  # one lane per call
    result = outcomes(producer)
    assert [result[n] for n in range(4)] == [AdvanceOutcome(1, 0, 0)] * 4
    assert result[4] == AdvanceOutcome(0, 0, 1, ("s: r",))


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (("raw", "payload"), "must yield EventBatch"),
        (EventBatch([], []), "at least one event"),
        (EventBatch(["a", "b"], [1]), "2 raw events, 1 payloads"),
        (EventBatch(["a"], [1], None, []), "0 event ids"),
        (EventBatch(["a"], [1], ["unhashable"]), "unhashable"),
    ],
)
async def test_a_malformed_batch_ends_the_group(
    manager: SharedStreamManager, item: Any, message: str
) -> None:
    producer = BatchingProducer()
    producer.feed_item(item)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        with pytest.raises(StreamTerminated) as raised:
            await anext(sub)
    assert isinstance(raised.value.__cause__, TypeError)
    assert message in str(raised.value.__cause__)
    assert producer.closed == 1


async def test_a_batch_larger_than_max_outstanding_waits_for_room_between_events() -> None:
    producer = BatchingProducer()
    producer.feed_item(batch_of(0, 10))
    async with (
        SharedStreamManager(max_outstanding=3) as manager,
        manager.subscribe("k", "s", producer=lambda: producer) as sub,
    ):
        await turn()
        [stats] = manager.stats()
        assert stats.outstanding == 3 and sub._group.log.head == 3
        got = []
        for _ in range(10):
            got.append(await anext(sub))
            [stats] = manager.stats()
            assert stats.outstanding <= 3
        assert got == [f"e{n}" for n in range(10)]


async def test_a_rostered_group_waits_for_room_within_a_batch() -> None:
    producer = BatchingProducer()
    producer.feed_item(batch_of(0, 6))
    roster = {"a", "b"}
    async with SharedStreamManager(subscriber_queue_size=2) as manager:
        a = manager.subscribe("k", "a", producer=lambda: producer, roster=roster)
        b = manager.subscribe("k", "b", producer=lambda: producer, roster=roster)
        async with a, b:
            await turn()
            assert a._group.log.head == 2  # a full queue: the rest of the batch waits
            seen_a, seen_b = [], []
            for _ in range(6):
                seen_a.append(await anext(a))
                seen_b.append(await anext(b))
                assert a._group.log.head - min(a._cursor, b._cursor) <= 2
            assert a._failure is None and b._failure is None  # waited, never overflowed
            assert seen_a == seen_b == [f"e{n}" for n in range(6)]
        await producer.wait_advanced(5)


async def test_a_batch_overflows_a_dynamic_subscriber_at_the_event_that_overflows() -> None:
    producer = BatchingProducer()
    producer.feed_item(batch_of(0, 5))
    async with SharedStreamManager(subscriber_queue_size=2) as manager:
        slow = manager.subscribe("k", "slow", producer=lambda: producer)
        async with slow:
            await turn()
            assert isinstance(slow._failure, Exception)
            assert "position 2" in str(slow._failure)  # the third event overflowed
        await producer.wait_advanced(5)
    assert outcomes(producer)[0] == AdvanceOutcome(0, 1, 0)


async def test_a_member_leaving_between_runs_of_a_batch_pauses_the_rest_of_it() -> None:
    """The poll yields to the loop between runs of a batch; a roster member that
    leaves then must stop the broadcast (the group pauses), not slip out of the
    snapshot of the rest of the batch."""
    producer = BatchingProducer()
    producer.feed_item(batch_of(0, 6))
    roster = {"a", "b"}
    async with SharedStreamManager(subscriber_queue_size=8) as manager:  # runs of 2
        a = manager.subscribe("k", "a", producer=lambda: producer, roster=roster)
        b = manager.subscribe("k", "b", producer=lambda: producer, roster=roster)

        async def take_one_and_leave() -> Any:
            async with b:
                return await anext(b)

        leaving = asyncio.create_task(take_one_and_leave())
        async with a:
            assert await leaving == "e0"
            await turn()
            group = a._group
            assert group.terminal is None and group.paused
            assert group.log.head == 2  # the first run only
            b = manager.subscribe("k", "b", producer=lambda: producer, roster=roster)
            async with b:
                assert [await anext(a) for _ in range(6)] == [f"e{n}" for n in range(6)]
                assert [await anext(b) for _ in range(4)] == [f"e{n}" for n in range(2, 6)]


async def test_expiry_fails_only_the_batches_that_owe_the_event(
    manager: SharedStreamManager, clock: FakeClock
) -> None:
    producer = fed(6)
    async with (
        manager.subscribe("k", "done", producer=lambda: producer) as done,
        manager.subscribe("k", "late", producer=lambda: producer) as late,
    ):
        early = await done.pull_batch(3)
        later = await done.pull_batch(3)
        manager.confirm_persisted([early.seq, later.seq])
        held = await late.pull_batch(2)  # e0, e1: never confirmed
        clock.advance(61.0)
        await producer.wait_advanced(6)
        with pytest.raises(AckTimeout):
            await anext(late)
        assert done._failure is None
    result = outcomes(producer)
    assert result[0] == result[1] == AdvanceOutcome(1, 1, 0)  # late owed them
    assert held.seq not in manager._bindings._by_seq


async def test_a_batch_resumed_after_every_member_failed_with_full_queues_is_broadcast() -> None:
    """Regression (found by the roster state machine): with every member force-failed,
    ``_make_room`` returned at once without refreshing the lowest-cursor hint; once the
    members were back, the stale hint left no room for the batch and ended the group."""
    clock = FakeClock()
    producer = BatchingProducer()
    producer.feed_item(EventBatch(["e0", "e1"], [0, 1]))
    roster = ("a", "b")
    async with SharedStreamManager(subscriber_queue_size=2, ack_timeout=10.0, clock=clock) as (
        manager
    ):
        subs = {
            name: manager.subscribe("k", name, producer=lambda: producer, roster=roster)
            for name in roster
        }
        await turn()
        clock.advance(10.0)  # both owe e0 and e1 (full queues): force-failed, paused
        producer.feed_item(EventBatch(["e2"], [2]))
        await turn()
        for name in roster:  # subscribed again: the group resumes
            await subs[name].aclose()
            subs[name] = manager.subscribe("k", name, producer=lambda: producer, roster=roster)
        for name in roster:
            async with subs[name] as sub:
                assert await asyncio.wait_for(anext(sub), 5) == "e2"
