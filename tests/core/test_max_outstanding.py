"""docs/production.md#max_outstanding: a group holds at most ``max_outstanding`` events broadcast
and not advanced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from ackgate import AdvanceItem, SharedStreamManager, SharedStreamProducer
from ackgate.testing import ScriptedProducer

from .conftest import turn


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8", None])
def test_max_outstanding_is_checked(value: Any) -> None:
    with pytest.raises(ValueError, match="max_outstanding"):
        SharedStreamManager(max_outstanding=value)


class SlowAdvance(SharedStreamProducer):
    """One lane per event, an endless upstream, and an ``advance`` that takes 1 ms."""

    def __init__(self) -> None:
        self.pulled = 0
        self.advanced = 0
        self.max_outstanding_seen = 0
        self.group: Any = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        while True:
            if self.group is not None:
                held = self.group.tracker.outstanding
                self.max_outstanding_seen = max(self.max_outstanding_seen, held)
            yield self.pulled, self.pulled
            self.pulled += 1

    def get_advance_lane(self, broker_payload: Any) -> Any:
        return broker_payload

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        await asyncio.sleep(0.001)
        self.advanced += len(batch)


async def test_a_slow_advance_holds_the_poll_at_max_outstanding() -> None:
    """Issue 11, defect 2: one lane per event, advance() 1 ms, cap 4."""
    producer = SlowAdvance()
    limit = 64
    async with (
        SharedStreamManager(
            max_concurrent_advances=4, max_outstanding=limit, subscriber_queue_size=10_000
        ) as manager,
        manager.subscribe("k", "s", producer=lambda: producer) as sub,
    ):
        producer.group = sub._group
        deadline = asyncio.get_running_loop().time() + 0.3
        while asyncio.get_running_loop().time() < deadline:
            await anext(sub)
            [stats] = manager.stats()
            assert stats.outstanding <= limit
        assert producer.max_outstanding_seen <= limit
        assert producer.advanced > limit  # progress, not a stall
        assert producer.pulled - producer.advanced <= limit
        assert len(sub._group.tracker.lanes) <= 2 * limit + 4097  # idle lanes swept


async def test_a_slow_subscriber_holds_the_poll_and_nothing_is_force_failed() -> None:
    producer = ScriptedProducer(lane=lambda payload: payload)
    for i in range(10):
        producer.feed(i, i)
    async with (
        SharedStreamManager(max_outstanding=3) as manager,
        manager.subscribe("k", "slow", producer=lambda: producer) as sub,
    ):
        await turn()
        [stats] = manager.stats()
        assert stats.outstanding == 3  # broadcast 0, 1, 2: then the poll waits
        assert sub._group.log.head == 3
        got = [await anext(sub) for _ in range(10)]  # each pull makes room
        assert got == list(range(10))
        assert stats.failed_subscribers == 0
        await producer.wait_advanced(9)


async def test_unconfirmed_outputs_hold_the_poll_until_confirmed() -> None:
    producer = ScriptedProducer()
    for i in range(5):
        producer.feed(i, i)
    async with (
        SharedStreamManager(max_outstanding=2) as manager,
        manager.subscribe("k", "s", producer=lambda: producer) as sub,
    ):
        seqs = []
        for _ in range(2):
            await anext(sub)
            seqs.append(sub.bind())
        pull = asyncio.create_task(anext(sub))  # closes the window on event 1
        await turn()
        assert not pull.done()  # event 2 is not pulled: 0 and 1 are unconfirmed
        assert manager.stats()[0].outstanding == 2
        manager.confirm_persisted(seqs)  # type: ignore[arg-type]
        assert await pull == 2
        await producer.wait_advanced(2)
