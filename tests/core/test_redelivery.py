"""docs/concepts.md#redelivery-memory: a redelivered event is not handed again to who already acked
it."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import pytest

import ackgate._core.group
from ackgate import SharedStreamManager, StreamTerminated, Subscription
from ackgate._core.redelivery import _MAX_SUBSCRIBER_IDS, RedeliveryMemory
from ackgate.testing import ScriptedProducer

from .conftest import turn


class IdentifiedProducer(ScriptedProducer):
    """Payloads are ``(id, copy)``; the event id is the first half."""

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        return broker_payload[0]


@pytest.fixture
def identified() -> IdentifiedProducer:
    return IdentifiedProducer()


def outcomes_by_copy(producer: ScriptedProducer) -> dict[Any, Any]:
    return {item.broker_payload: item.outcome for batch in producer.batches for item in batch}


def pair(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> tuple[Subscription, Subscription]:
    return (
        manager.subscribe("k", "healthy", producer=lambda: producer),
        manager.subscribe("k", "flaky", producer=lambda: producer),
    )


async def test_only_the_subscriber_that_did_not_ack_is_handed_the_copy(
    manager: SharedStreamManager, identified: IdentifiedProducer
) -> None:
    healthy, flaky = pair(manager, identified)
    identified.feed("x", ("x", 1))
    identified.feed("y", ("y", 1))
    assert [await anext(healthy), await anext(healthy)] == ["x", "y"]  # acked "x"
    assert await anext(flaky) == "x"
    flaky.reject()
    identified.feed("x", ("x", 2))  # the broker redelivers it
    identified.feed("z", ("z", 1))
    assert await anext(healthy) == "z"  # copy 2 of "x" is skipped
    assert [await anext(flaky), await anext(flaky)] == ["y", "x"]  # a reject is not carried
    assert await anext(flaky) == "z"
    await identified.wait_advanced(3)
    result = outcomes_by_copy(identified)
    assert (result[("x", 1)].acked, result[("x", 1)].rejected) == (1, 1)
    assert result[("x", 2)].acked == 2 and result[("x", 2)].is_clean
    (stats,) = manager.stats()
    assert stats.redeliveries_skipped == 1
    assert (healthy.redeliveries_skipped, flaky.redeliveries_skipped) == (1, 0)


async def test_an_event_rejected_in_a_batch_is_handed_its_copy(
    manager: SharedStreamManager, identified: IdentifiedProducer
) -> None:
    """Per-event producer, batch subscriber: a reject of one event of a pulled batch
    is never carried over as an ack of its id."""
    sub = manager.subscribe("k", "batcher", producer=lambda: identified)
    identified.feed("x", ("x", 1))
    batch = await sub.pull_batch(1)
    manager.reject_in_batch(batch.seq, [0], "bad row")
    identified.feed("x", ("x", 2))  # the broker redelivers it
    async with asyncio.timeout(5):  # a wrongly remembered ack would skip the copy
        again = await sub.pull_batch(1)
    assert again.events == ["x"]
    manager.confirm_persisted([again.seq])
    await identified.wait_advanced(2)
    result = outcomes_by_copy(identified)
    assert result[("x", 1)].rejected == 1
    assert result[("x", 1)].reasons == ("batcher: bad row",)
    assert result[("x", 2)].acked == 1
    assert sub.redeliveries_skipped == 0
    await sub.aclose()


async def test_a_copy_everyone_acked_is_advanced_without_being_handed_out(
    manager: SharedStreamManager, identified: IdentifiedProducer
) -> None:
    healthy, flaky = pair(manager, identified)
    identified.feed("x", ("x", 1))
    identified.feed("x", ("x", 2))
    identified.feed("y", ("y", 1))
    for sub in (healthy, flaky):
        assert await anext(sub) == "x"
    for sub in (healthy, flaky):
        # Moving on acks copy 1; copy 2, broadcast before, is passed at its hand-out.
        assert await anext(sub) == "y"
    identified.feed("x", ("x", 3))
    identified.feed("z", ("z", 1))
    for sub in (healthy, flaky):
        assert await anext(sub) == "z"  # copy 3 is skipped for both at its broadcast
    await identified.wait_advanced(4)
    result = outcomes_by_copy(identified)
    assert result[("x", 2)].acked == result[("x", 3)].acked == 2
    assert manager.stats()[0].redeliveries_skipped == 4


async def test_unconfirmed_outputs_are_not_an_ack(
    manager: SharedStreamManager, identified: IdentifiedProducer
) -> None:
    healthy, flaky = pair(manager, identified)
    identified.feed("x", ("x", 1))
    for sub in (healthy, flaky):
        assert await anext(sub) == "x"
    seq = healthy.bind()
    assert seq is not None
    identified.feed("x", ("x", 2))
    identified.feed("y", ("y", 1))
    assert await anext(healthy) == "x"  # its output for copy 1 is unconfirmed
    assert await anext(flaky) == "y"  # it acked copy 1 by moving on
    manager.confirm_persisted([seq])
    assert (healthy.redeliveries_skipped, flaky.redeliveries_skipped) == (0, 1)


async def test_leaving_with_skipped_copies_queued_does_not_fail_them(
    manager: SharedStreamManager, identified: IdentifiedProducer
) -> None:
    healthy, flaky = pair(manager, identified)
    identified.feed("x", ("x", 1))
    identified.feed("y", ("y", 1))
    for sub in (healthy, flaky):
        assert await anext(sub) == "x"
    flaky.reject()
    assert await anext(healthy) == "y"  # acks "x"
    identified.feed("x", ("x", 2))  # queued for healthy, but skipped: it acked copy 1
    await turn()
    await healthy.aclose()
    assert [await anext(flaky), await anext(flaky)] == ["y", "x"]
    await flaky.aclose()
    result = outcomes_by_copy(identified)
    assert (result[("x", 2)].acked, result[("x", 2)].failed) == (2, 0)


async def test_a_resubscribed_id_keeps_what_it_acked(
    manager: SharedStreamManager, identified: IdentifiedProducer
) -> None:
    roster = ("healthy", "flaky")
    subs = {
        name: manager.subscribe("k", name, producer=lambda: identified, roster=roster)
        for name in roster
    }
    identified.feed("x", ("x", 1))
    for sub in subs.values():
        assert await anext(sub) == "x"
    pending = asyncio.ensure_future(anext(subs["healthy"]))  # acks copy 1
    await turn()
    await subs["flaky"].__aexit__(RuntimeError, RuntimeError("crash"), None)
    subs["flaky"] = manager.subscribe("k", "flaky", producer=lambda: identified, roster=roster)
    identified.feed("x", ("x", 2))
    identified.feed("y", ("y", 1))
    assert await anext(subs["flaky"]) == "x"
    assert await pending == "y"
    assert await anext(subs["flaky"]) == "y"
    await identified.wait_advanced(2)
    result = outcomes_by_copy(identified)
    assert (result[("x", 1)].acked, result[("x", 1)].failed) == (1, 1)
    assert (result[("x", 2)].acked, result[("x", 2)].failed) == (2, 0)
    assert subs["healthy"].redeliveries_skipped == 1
    assert subs["flaky"].redeliveries_skipped == 0


async def test_without_an_event_id_every_copy_is_handed_out(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    healthy, flaky = pair(manager, producer)
    producer.feed("x", ("x", 1))
    producer.feed("x", ("x", 2))
    for sub in (healthy, flaky):
        assert [await anext(sub), await anext(sub)] == ["x", "x"]
    assert manager.stats()[0].redeliveries_skipped == 0


async def test_a_raising_get_event_id_ends_the_group(manager: SharedStreamManager) -> None:
    class Broken(ScriptedProducer):
        def get_event_id(self, broker_payload: Any) -> Hashable | None:
            raise KeyError(broker_payload)

    broken = Broken()
    sub = manager.subscribe("k", "s", producer=lambda: broken)
    broken.feed("x", 1)
    with pytest.raises(StreamTerminated) as caught:
        await anext(sub)
    assert isinstance(caught.value.__cause__, KeyError)


async def test_the_oldest_ids_are_forgotten_first(
    monkeypatch: pytest.MonkeyPatch, manager: SharedStreamManager, identified: IdentifiedProducer
) -> None:
    monkeypatch.setattr(ackgate._core.group, "_REMEMBERED_EVENT_IDS", 2)
    sub = manager.subscribe("k", "s", producer=lambda: identified)
    for name in ("a", "b", "c"):
        identified.feed(name, (name, 1))
    for name in ("a", "b", "c"):
        assert await anext(sub) == name
    identified.feed("a", ("a", 2))  # forgotten: handed again
    identified.feed("c", ("c", 2))  # remembered once "c" is acked (next pull)
    assert await anext(sub) == "a"
    identified.feed("end", ("end", 1))
    assert await anext(sub) == "end"  # "c" copy 2 skipped
    assert manager.stats()[0].redeliveries_skipped == 1


def test_memory_never_reuses_a_subscriber_bit() -> None:
    memory = RedeliveryMemory(capacity=4)
    bits = [memory.bit(n) for n in range(_MAX_SUBSCRIBER_IDS)]
    assert bits == list(range(_MAX_SUBSCRIBER_IDS))
    assert memory.bit("one too many") is None
    assert memory.bit(0) == 0
    for cell in memory.cells(range(10)):
        cell[0] |= 1 << 3
    assert len(memory) == 4  # the oldest forgotten
    # [acked bits, copies broadcast]: 9 is remembered, 0 was forgotten
    assert memory.cells([9])[0] == [1 << 3, 2] and memory.cells([0])[0] == [0, 1]


async def test_passing_skipped_copies_makes_room_for_a_blocked_poll(
    clock: Any, identified: IdentifiedProducer
) -> None:
    """Regression: a subscriber that only passed skipped copies never woke the poll
    waiting for room (overflow="block", and every rostered group), which then
    stalled for good."""
    async with SharedStreamManager(
        clock=clock, overflow="block", subscriber_queue_size=2
    ) as manager:
        healthy, flaky = pair(manager, identified)
        for n in range(3):
            identified.feed(n, (n, 1))
        for n in range(3):
            assert await anext(flaky) == n
            flaky.reject()
            assert await anext(healthy) == n  # acks the one before
        for n in range(3):
            identified.feed(n, (n, 2))  # copies 0 and 1 are skipped for healthy
        identified.feed("end", ("end", 1))
        async with asyncio.timeout(5):
            assert [await anext(flaky), await anext(flaky)] == [0, 1]
            await turn()  # the poll now waits for healthy's cursor to make room
            assert manager.stats()[0].outstanding < 6
            # healthy acks 2 and passes the skipped copies 0 and 1: room for the rest
            done = asyncio.ensure_future(anext(healthy))
            assert [await anext(flaky), await anext(flaky)] == [2, "end"]
            assert await done == "end"
