"""docs/writing-an-adapter.md#1-the-producer: the producer contract, as seen from ackgate's side."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from ackgate import (
    AdvanceFailed,
    AdvanceItem,
    AdvanceOutcome,
    SharedStreamManager,
    SharedStreamProducer,
    StreamTerminated,
)
from ackgate.testing import ScriptedProducer

from .conftest import turn


async def drain_all(sub: Any) -> list[Any]:
    got = []
    async for raw in sub:
        got.append(raw)
    return got


async def test_open_stream_returning_ends_group_with_stream_terminated(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    producer.feed("a", ("L", 0))
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    async with sub:
        assert await anext(sub) == "a"
        producer.end()
        with pytest.raises(StreamTerminated) as info:
            await anext(sub)
    assert info.value.__cause__ is None
    assert producer.closed == 1


async def test_open_stream_raising_ends_group_with_cause(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    boom = ConnectionError("broker gone")
    producer.fail(boom)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        with pytest.raises(StreamTerminated) as info:
            await anext(sub)
    assert info.value.__cause__ is boom
    assert type(info.value) is StreamTerminated


@pytest.mark.parametrize("item", ["not a pair", ("one",), ("a", "b", "c"), None, ["a", "b"]])
async def test_yielding_a_non_pair_ends_group(
    manager: SharedStreamManager, producer: ScriptedProducer, item: object
) -> None:
    producer.feed_item(item)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        with pytest.raises(StreamTerminated) as info:
            await anext(sub)
    assert isinstance(info.value.__cause__, TypeError)
    assert "pairs" in str(info.value.__cause__)
    assert producer.closed == 1


async def test_raising_lane_ends_group_with_cause(manager: SharedStreamManager) -> None:
    boom = KeyError("no lane")

    def lane(payload: object) -> object:
        raise boom

    producer = ScriptedProducer(lane=lane)  # type: ignore[arg-type]
    producer.feed("a", 1)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        with pytest.raises(StreamTerminated) as info:
            await anext(sub)
    assert info.value.__cause__ is boom


async def test_unhashable_lane_ends_group(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer(lane=lambda payload: [payload])  # type: ignore[arg-type, return-value]
    producer.feed("a", 1)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        with pytest.raises(StreamTerminated) as info:
            await anext(sub)
    assert isinstance(info.value.__cause__, TypeError)


async def test_lane_is_computed_once_per_event(manager: SharedStreamManager) -> None:
    calls: list[object] = []

    def lane(payload: object) -> object:
        calls.append(payload)
        return payload

    producer = ScriptedProducer(lane=lane)  # type: ignore[arg-type]
    for i in range(5):
        producer.feed(i, i)
    async with (
        manager.subscribe("k", "a", producer=lambda: producer) as a,
        manager.subscribe("k", "b", producer=lambda: producer) as b,
    ):
        for _ in range(5):
            await anext(a)
            await anext(b)
    assert calls == [0, 1, 2, 3, 4]


async def test_factory_and_connection_are_lazy_and_once_per_group(
    manager: SharedStreamManager,
) -> None:
    made: list[ScriptedProducer] = []

    def factory() -> ScriptedProducer:
        made.append(ScriptedProducer())
        made[-1].feed("x", 0)
        return made[-1]

    a = manager.subscribe("k", "a", producer=factory)
    b = manager.subscribe("k", "b", producer=factory)
    assert made == []  # nothing is opened inside subscribe()
    assert await anext(a) == "x" and await anext(b) == "x"
    assert len(made) == 1 and made[0].opened == 1
    await a.aclose()
    await b.aclose()
    assert made[0].closed == 1


async def test_factory_returning_a_non_producer_ends_group(manager: SharedStreamManager) -> None:
    async with manager.subscribe("k", "s", producer=lambda: object()) as sub:  # type: ignore[arg-type, return-value]
        with pytest.raises(StreamTerminated) as info:
            await anext(sub)
    assert isinstance(info.value.__cause__, TypeError)


async def test_batch_is_contiguous_resolved_prefix_of_one_lane(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    for i in range(6):
        producer.feed(i, ("A" if i % 2 == 0 else "B", i))
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        held = []
        for _ in range(6):
            await anext(sub)
            held.append(sub.bind())
        await turn()
        assert producer.batches == []  # nothing resolved: outputs are unconfirmed
        manager.confirm_persisted([held[2], held[4]])  # A's events 2 and 4, not 0
        await turn()
        assert producer.batches == []  # lane A's prefix is still blocked by event 0
        manager.confirm_persisted([held[0]])
        await producer.wait_advanced(3)
        assert [item.broker_payload for item in producer.batches[0]] == [
            ("A", 0),
            ("A", 2),
            ("A", 4),
        ]
        manager.confirm_persisted(held)
        await producer.wait_advanced(5)
    for batch in producer.batches:
        lanes = {item.broker_payload[0] for item in batch}
        assert len(lanes) == 1
    b_order = [p for p in producer.advanced_payloads if p[0] == "B"]
    assert b_order == [("B", 1), ("B", 3), ("B", 5)]


async def test_one_advance_in_flight_per_lane_and_at_most_the_cap(clock: Any) -> None:
    producer = ScriptedProducer(lane=lambda payload: payload % 4)
    gate = producer.advance_gate = asyncio.Event()
    async with SharedStreamManager(max_concurrent_advances=2, clock=clock) as manager:
        for i in range(40):
            producer.feed(i, i)
        async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
            for _ in range(40):
                await anext(sub)
            await turn()
            assert producer.in_flight == 2  # two lanes in flight, capped
            gate.set()
            await producer.wait_advanced(39)
    assert producer.max_in_flight == 2
    for lane in range(4):
        order = [p for p in producer.advanced_payloads if p % 4 == lane]
        assert order == sorted(order)


async def test_default_cap_is_one_call_for_the_whole_group(
    manager: SharedStreamManager,
) -> None:
    producer = ScriptedProducer(lane=lambda payload: payload)
    gate = producer.advance_gate = asyncio.Event()
    for i in range(5):
        producer.feed(i, i)
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        for _ in range(5):
            await anext(sub)
        await turn()
        assert producer.in_flight == 1
        gate.set()
        await producer.wait_advanced(4)
    assert producer.max_in_flight == 1


async def test_sub_reject_counts_rejected_in_the_outcome(
    manager: SharedStreamManager, producer: ScriptedProducer
) -> None:
    sub = manager.subscribe("k", "s", producer=lambda: producer)
    producer.feed("a", ("L", 0))
    assert await anext(sub) == "a"
    sub.reject()  # resolve, but stay subscribed on a force-failed path below
    # Force-fail the only subscriber by overflow: its snapshot is gone afterwards.
    await sub.aclose()
    assert producer.batches[0][0].outcome == AdvanceOutcome(acked=0, failed=0, rejected=1)


async def test_event_broadcast_to_nobody_is_advanced_not_clean(
    clock: Any,
) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock, subscriber_queue_size=1) as manager:
        sub = manager.subscribe("k", "s", producer=lambda: producer)
        producer.feed("a", 0)
        producer.feed("b", 1)  # overflows the queue of one: the subscriber is force-failed
        producer.feed("c", 2)  # broadcast to nobody
        await producer.wait_advanced(3)
        outcomes = [item.outcome for batch in producer.batches for item in batch]
        assert outcomes[2] == AdvanceOutcome(0, 0, 0)
        assert not outcomes[2].is_clean
        await sub.aclose()


async def test_advance_error_ends_group_loudly(
    manager: SharedStreamManager, caplog: pytest.LogCaptureFixture
) -> None:
    producer = ScriptedProducer(lane=lambda payload: payload % 2)
    boom = RuntimeError("commit refused")
    producer.advance_error = boom
    for i in range(4):
        producer.feed(i, i)
    a = manager.subscribe("k", "a", producer=lambda: producer)
    b = manager.subscribe("k", "b", producer=lambda: producer)
    assert await anext(a) == 0 and await anext(b) == 0
    await anext(a)
    await anext(b)  # event 0 resolved: its advance raises
    with pytest.raises(AdvanceFailed) as info:
        while True:
            await anext(a)
    assert info.value.__cause__ is boom
    with pytest.raises(AdvanceFailed):
        while True:
            await anext(b)
    await a.aclose()
    await b.aclose()
    assert producer.batches == []  # nothing advanced after (or in) the failed call
    assert producer.closed == 1
    assert "advance" in caplog.text


async def test_aclose_runs_once_after_last_advance_and_after_stream_finally(
    manager: SharedStreamManager,
) -> None:
    order: list[str] = []

    class Recording(SharedStreamProducer):
        async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
            try:
                for i in range(3):
                    yield i, i
                await asyncio.Event().wait()
            finally:
                order.append("stream finally")

        async def advance(self, batch: Sequence[AdvanceItem]) -> None:
            await asyncio.sleep(0)
            order.append(f"advance {[item.broker_payload for item in batch]}")

        async def aclose(self) -> None:
            order.append("aclose")

    async with manager.subscribe("k", "s", producer=Recording) as sub:
        for _ in range(3):
            await anext(sub)
    assert order[-1] == "aclose" and order.count("aclose") == 1
    assert order.index("stream finally") < order.index("aclose")
    advanced = [entry for entry in order if entry.startswith("advance")]
    assert advanced and advanced[-1].endswith("2]")


async def test_aclose_error_is_logged_not_raised(
    manager: SharedStreamManager, caplog: pytest.LogCaptureFixture
) -> None:
    class Failing(ScriptedProducer):
        async def aclose(self) -> None:
            raise OSError("socket already gone")

    producer = Failing()
    producer.feed("a", 0)
    with caplog.at_level(logging.WARNING, logger="ackgate"):
        async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
            await anext(sub)
    assert any(r.levelno == logging.WARNING and "aclose" in r.getMessage() for r in caplog.records)


async def test_event_for_nobody_waits_behind_an_unresolved_one_in_its_lane(clock: Any) -> None:
    producer = ScriptedProducer()
    async with SharedStreamManager(clock=clock, subscriber_queue_size=1) as manager:
        idle = manager.subscribe("k", "idle", producer=lambda: producer)
        worker = manager.subscribe("k", "worker", producer=lambda: producer)
        producer.feed("e0", 0)
        assert await anext(worker) == "e0"
        seq = worker.bind()
        producer.feed("e1", 1)  # "idle" never read e0: it overflows and is force-failed
        assert await anext(worker) == "e1"
        await worker.aclose()  # leaves cleanly; its output for e0 is still unconfirmed
        producer.feed("e2", 2)  # broadcast to nobody, behind e0 in the only lane
        await producer.starved.wait()
        await turn()
        assert producer.batches == []
        manager.confirm_persisted([seq])
        await producer.wait_advanced(3)
        assert [(item.broker_payload, item.outcome) for item in producer.batches[0]] == [
            (0, AdvanceOutcome(acked=1, failed=1, rejected=0)),
            (1, AdvanceOutcome(acked=1, failed=1, rejected=0)),
            (2, AdvanceOutcome(acked=0, failed=0, rejected=0)),
        ]
        await idle.aclose()


async def test_lanes_that_never_repeat_do_not_accumulate(manager: SharedStreamManager) -> None:
    producer = ScriptedProducer(lane=lambda payload: payload)  # every event its own lane
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        for i in range(10_000):
            producer.feed(i, i)
            await anext(sub)
        await producer.wait_advanced(9_999)
        [group] = manager._groups.values()
        assert len(group.tracker.lanes) <= 4_097
        assert manager.stats()[0].lanes <= 1


async def test_advanced_events_are_not_retained(manager: SharedStreamManager) -> None:
    """Nothing keeps a raw event alive once it was advanced: memory follows
    outstanding events, not the ack timeout's span of history."""

    class Raw:
        pass

    producer = ScriptedProducer()
    raws = [Raw() for _ in range(50)]
    refs = [weakref.ref(raw) for raw in raws]
    async with manager.subscribe("k", "s", producer=lambda: producer) as sub:
        for i, raw in enumerate(raws):
            producer.feed(raw, i)
        del raws, raw
        for _ in range(50):
            await anext(sub)
        producer.feed(Raw(), 50)
        await anext(sub)  # resolves event 49; the subscription is on event 50
        await producer.wait_advanced(50)
        producer.batches.clear()  # the test's own record of payloads
        gc.collect()
        assert [ref for ref in refs if ref() is not None] == []
