"""A fetched batch travels through the group as one unit, a run (issue #22).

A run is one log entry, one pending count and one advance for as long as every
subscriber treats its events alike; an event treated differently (a reject, a
failure, an ack timeout, a leave in the middle of the run) is listed alone in the
run's :class:`~ackgate.AdvanceRun` ``exceptions``. Each event still resolves exactly
as if it had been yielded alone (``test_stateful.py`` checks that at random).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

import pytest

from ackgate import (
    AckTimeout,
    AdvanceOutcome,
    AdvanceRun,
    EventBatch,
    IdRange,
    SharedStreamManager,
    SubscriberOverflow,
)
from ackgate.testing import FakeClock, ScriptedProducer, ScriptedRunsProducer

from .conftest import turn

CLEAN_2 = AdvanceOutcome(2, 0, 0)


class BatchRuns(ScriptedRunsProducer):
    """Fed ``EventBatch`` es (``feed_item``), read through ``open_stream_batches``,
    advanced by runs."""

    async def open_stream_batches(self) -> AsyncIterator[EventBatch]:
        async for batch in ScriptedProducer.open_stream(self):
            yield batch


def batch(first: int, count: int, lane: Hashable = "p0", ids: bool = True) -> EventBatch:
    """Events ``first .. first + count - 1``: raw ``"e<n>"``, payload ``n``."""
    numbers = range(first, first + count)
    return EventBatch(
        [f"e{n}" for n in numbers],
        list(numbers),
        lane,
        IdRange(("t", lane), first, count) if ids else None,
    )


def runs(producer: ScriptedRunsProducer) -> list[AdvanceRun]:
    return [run for call in producer.runs for run in call]


def flat(producer: ScriptedRunsProducer) -> dict[Any, AdvanceOutcome]:
    return {
        payload: run.outcome_of(index)
        for run in runs(producer)
        for index, payload in enumerate(run.broker_payloads)
    }


async def test_a_batch_every_subscriber_acks_is_advanced_as_one_run(
    manager: SharedStreamManager,
) -> None:
    producer = BatchRuns()
    producer.feed_item(batch(0, 100))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    pulled = await a.pull_batch(1000)
    assert pulled.events == [f"e{n}" for n in range(100)]
    for _ in range(100):
        await anext(b)
    manager.confirm_persisted([pulled.seq])
    await b.aclose()  # done with the last event: the run is resolved
    await producer.wait_advanced(100)
    [run] = runs(producer)
    assert list(run.broker_payloads) == list(range(100))
    assert run.outcome == AdvanceOutcome(2, 0, 0)
    assert run.exceptions == {}
    assert manager.stats()[0].advance_calls == 1
    await a.aclose()


async def test_a_reject_in_the_middle_of_a_run_is_listed_alone(
    manager: SharedStreamManager,
) -> None:
    producer = BatchRuns()
    producer.feed_item(batch(0, 5))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    held = await a.pull_batch(5)
    manager.reject_in_batch(held.seq, [2], reason="bad")
    manager.confirm_persisted([held.seq])
    async with b:
        for n in range(5):
            assert await anext(b) == f"e{n}"
            if n == 3:
                b.reject()
    await producer.wait_advanced(5)
    [run] = runs(producer)
    assert run.outcome == CLEAN_2
    assert dict(run.exceptions) == {
        2: AdvanceOutcome(1, 0, 1, ("a: bad",)),
        3: AdvanceOutcome(1, 0, 1),
    }
    await a.aclose()


async def test_a_leave_in_the_middle_of_a_run_fails_the_rest_of_it(
    manager: SharedStreamManager,
) -> None:
    producer = BatchRuns()
    producer.feed_item(batch(0, 4))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    confirmed = await a.pull_batch(4)
    manager.confirm_persisted([confirmed.seq])
    await anext(b)
    await anext(b)  # on e1: e0 acked
    with pytest.raises(RuntimeError):
        async with b:
            raise RuntimeError("crash on e1")
    await producer.wait_advanced(4)
    assert flat(producer) == {
        0: CLEAN_2,
        1: AdvanceOutcome(1, 1, 0),
        2: AdvanceOutcome(1, 1, 0),
        3: AdvanceOutcome(1, 1, 0),
    }
    await a.aclose()


async def test_an_ack_timeout_in_the_middle_of_a_run_fails_what_is_still_owed(
    manager: SharedStreamManager, clock: FakeClock
) -> None:
    producer = BatchRuns()
    producer.feed_item(batch(0, 3))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    held = await a.pull_batch(3)
    manager.confirm_persisted([held.seq])
    await anext(b)
    await anext(b)  # on e1: e0 acked
    clock.advance(61.0)
    await turn()
    with pytest.raises(AckTimeout):
        await anext(b)
    await producer.wait_advanced(3)
    assert flat(producer) == {
        0: CLEAN_2,
        1: AdvanceOutcome(1, 1, 0),
        2: AdvanceOutcome(1, 1, 0),
    }
    await a.aclose()
    await b.aclose()


async def test_failing_a_batch_of_whole_runs_counts_once_per_run(
    manager: SharedStreamManager,
) -> None:
    producer = BatchRuns()
    producer.feed_item(batch(0, 3))
    producer.feed_item(batch(3, 2))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    await turn()
    held = await a.pull_batch(10)
    assert len(held.events) == 5
    manager.fail_bound([held.seq])
    await producer.wait_advanced(5)
    assert [
        (len(run.broker_payloads), run.outcome, dict(run.exceptions)) for run in runs(producer)
    ] == [
        (3, AdvanceOutcome(0, 1, 0), {}),
        (2, AdvanceOutcome(0, 1, 0), {}),
    ]
    await a.aclose()


async def test_a_run_ends_at_the_event_that_overflows_a_subscriber() -> None:
    async with SharedStreamManager(subscriber_queue_size=3) as manager:
        producer = BatchRuns()
        producer.feed_item(batch(0, 6))
        fast = manager.subscribe("k", "fast", producer=lambda: producer)
        slow = manager.subscribe("k", "slow", producer=lambda: producer)
        taken = []
        while len(taken) < 6:
            held = await fast.pull_batch(6)
            taken += held.events
            manager.confirm_persisted([held.seq])
        with pytest.raises(SubscriberOverflow):
            await anext(slow)
        await producer.wait_advanced(6)
        # The slow one overflowed on e3: failed on e0..e3, not in e4's snapshot.
        assert flat(producer) == {
            **{n: AdvanceOutcome(1, 1, 0) for n in range(4)},
            **{n: AdvanceOutcome(1, 0, 0) for n in range(4, 6)},
        }
        await fast.aclose()
        await slow.aclose()


async def test_a_redelivered_run_is_skipped_event_by_event_by_who_acked_it(
    manager: SharedStreamManager,
) -> None:
    producer = BatchRuns()
    producer.feed_item(batch(0, 4))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    held = await a.pull_batch(4)
    manager.confirm_persisted([held.seq])
    async with b:
        for n in range(4):
            assert await anext(b) == f"e{n}"
            if n == 1:
                b.reject()  # b is handed the copy of e1 again; a is not
        # The broker redelivers offsets 0..3 (b rejected one: the commit was held).
        producer.feed_item(batch(0, 4))
        assert await anext(b) == "e1"  # it acked e0, e2 and e3
        producer.feed_item(batch(4, 1))
        assert (await a.pull_batch(10)).events == ["e4"]  # the copies were passed
        assert a.redeliveries_skipped == 4
        assert b.redeliveries_skipped == 3
        assert await anext(b) == "e4"
    await a.aclose()


async def test_copies_of_a_range_go_one_by_one_and_new_ids_together(
    manager: SharedStreamManager,
) -> None:
    """A copy of offsets 2..5 and new offsets 8..9 after runs 0..3 and 4..7: each copy
    is a run alone (subscribers may have acked some of a run and not the rest), the
    new ids one run. A subscriber that acked only the first run skips 2..3 and is
    handed 4..5, then 8..9."""
    producer = BatchRuns()
    producer.feed_item(batch(0, 4))
    producer.feed_item(batch(4, 4))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    first = await a.pull_batch(4)
    manager.confirm_persisted([first.seq])
    second = await a.pull_batch(4)
    assert second.events == [f"e{n}" for n in range(4, 8)]
    producer.feed_item(batch(2, 4))
    producer.feed_item(batch(8, 2))
    again: list[str] = []
    seqs = [second.seq]
    while len(again) < 4:
        more = await a.pull_batch(10)
        again += more.events
        seqs.append(more.seq)
    assert again == ["e4", "e5", "e8", "e9"]  # 2..3 passed: acked; 4..5 not acked yet
    assert a.redeliveries_skipped == 2
    manager.confirm_persisted(seqs)
    await producer.wait_advanced(14)
    assert [list(run.broker_payloads) for run in runs(producer)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [2],
        [3],
        [4],
        [5],
        [8, 9],
    ]
    await a.aclose()


async def test_runs_of_several_lanes_advance_each_in_its_lane(
    manager: SharedStreamManager,
) -> None:
    producer = BatchRuns()
    producer.feed_item(batch(0, 3, lane="p0"))
    producer.feed_item(batch(10, 3, lane="p1"))
    producer.feed_item(batch(3, 2, lane="p0"))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    await turn()
    held = await a.pull_batch(100)
    assert held.events == ["e0", "e1", "e2", "e10", "e11", "e12", "e3", "e4"]
    manager.confirm_persisted([held.seq])
    await producer.wait_advanced(8)
    lanes: dict[Any, list[int]] = {}
    for call in producer.runs:
        payloads = [p for run in call for p in run.broker_payloads]
        lanes.setdefault(payloads[0] // 10, []).extend(payloads)
    assert lanes == {0: [0, 1, 2, 3, 4], 1: [10, 11, 12]}
    await a.aclose()


def test_a_run_needs_ids_alike_in_the_redelivery_memory() -> None:
    from ackgate._core.redelivery import RedeliveryMemory

    memory = RedeliveryMemory(1000)
    memory.remember(IdRange(("t", 0), 0, 10))
    memory.remember(IdRange(("t", 0), 30, 10))
    ids = IdRange(("t", 0), 5, 40)
    assert memory.run_length(ids, 0, 40) == 1  # 5: a copy, alone
    assert memory.run_length(ids, 5, 35) == 20  # 10..29: new, up to the next span
    assert memory.run_length(ids, 35, 5) == 5  # 40..44: new
    assert memory.run_length(IdRange(("t", 1), 5, 9), 0, 9) == 9  # another prefix
    cells: Sequence[Hashable] = ["x", "y", "x", "z"]
    assert memory.run_length(cells, 0, 4) == 2  # "x" twice: the copy starts a run
    memory.remember(["y"])
    assert memory.run_length(cells, 1, 3) == 1  # "y" seen before: alone


async def test_a_copy_given_without_its_range_is_still_known(
    manager: SharedStreamManager,
) -> None:
    """A broker's refetch with a gap comes as a list of ids, not an ``IdRange``: the
    copies in it are still recognised against the ranges they were part of."""
    producer = BatchRuns()
    producer.feed_item(batch(0, 4))
    a = manager.subscribe("k", "a", producer=lambda: producer)
    first = await a.pull_batch(4)
    manager.confirm_persisted([first.seq])
    producer.feed_item(
        EventBatch(["e1", "e3", "e4"], [1, 3, 4], "p0", [("t", "p0", n) for n in (1, 3, 4)])
    )
    again = await a.pull_batch(10)
    assert again.events == ["e4"]  # 1 and 3 were acked as part of the range 0..3
    assert a.redeliveries_skipped == 2
    await a.aclose()


async def test_a_range_refetched_after_a_fetch_with_a_gap_is_still_known(
    manager: SharedStreamManager,
) -> None:
    """The other way round: a fetch with a gap (Kafka's offset map left a finished
    offset out) comes as a list of ids, and a later refetch of the same offsets as an
    ``IdRange``. The copies in the range are recognised against those ids."""
    producer = BatchRuns()
    producer.feed_item(
        EventBatch(["e1", "e3", "e4"], [1, 3, 4], "p0", [("t", "p0", n) for n in (1, 3, 4)])
    )
    a = manager.subscribe("k", "a", producer=lambda: producer)
    first = await a.pull_batch(3)
    manager.confirm_persisted([first.seq])
    producer.feed_item(batch(1, 6))  # 1..6: 2, 5 and 6 are new
    handed: list[str] = []
    while len(handed) < 3:  # broadcast as runs: 1, 2, 3, 4, then 5..6 together
        handed += (await a.pull_batch(10)).events
    assert handed == ["e2", "e5", "e6"]
    assert a.redeliveries_skipped == 3
    await a.aclose()


def test_a_range_is_cut_at_the_ids_remembered_one_by_one() -> None:
    from ackgate._core.redelivery import RedeliveryMemory

    memory = RedeliveryMemory(4)
    memory.remember([("t", 0, 3), ("t", 0, 7)])
    ids = IdRange(("t", 0), 0, 10)
    assert memory.run_length(ids, 0, 10) == 3  # 0..2, up to the copy of 3
    assert memory.run_length(ids, 3, 7) == 1  # 3: a copy, alone
    assert memory.run_length(ids, 4, 6) == 3  # 4..6
    assert memory.remember(IdRange(("t", 0), 3, 1)).redelivered
    assert not memory.remember(IdRange(("t", 0), 4, 3)).redelivered
    memory.remember(["u", "v", "w", "x"])  # the cells of ("t", 0) are forgotten
    assert memory.run_length(IdRange(("t", 0), 7, 3), 0, 3) == 3


async def test_the_end_of_the_upstream_leaves_the_open_event_of_a_run_unresolved(
    manager: SharedStreamManager,
) -> None:
    """The stream ends while a subscriber is on the first event of a run: the rest of
    the run fails for it, the event it is on stays open, so nothing of the run is
    advanced by the group's stop."""
    producer = BatchRuns()
    producer.feed_item(batch(0, 2))
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    assert await anext(sub) == "e0"
    producer.end()
    while not producer.closed:
        await turn(1)
    assert producer.runs == []
    await sub.aclose()


async def test_two_outputs_on_one_event_of_a_run_both_hold_it_until_confirmed(
    manager: SharedStreamManager,
) -> None:
    """Every output bound to an event of a longer run holds the run until confirmed:
    confirming them one by one lets the run go once the last is in (found by the state
    machine at 10,000 examples: a second output was never let go)."""
    producer = BatchRuns()
    producer.feed_item(batch(0, 2))
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    assert await anext(sub) == "e0"
    first, second = sub.bind(), sub.bind()
    assert await anext(sub) == "e1"
    waiting = asyncio.create_task(anext(sub))  # closes the window on e1
    await turn()
    manager.confirm_persisted([first])
    await turn()
    assert producer.runs == []  # e0 still waits for its second output
    manager.confirm_persisted([second])
    await producer.wait_advanced(2)
    assert flat(producer) == {0: AdvanceOutcome(1, 0, 0), 1: AdvanceOutcome(1, 0, 0)}
    waiting.cancel()
    await sub.aclose()
