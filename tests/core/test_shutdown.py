"""docs/writing-an-adapter.md#1-the-producer, docs/concepts.md#window: how a group stops — no
advance overlaps or outlives it, the producer's ``finally`` runs to its end, and a stopped group is
freed."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from ackgate import AdvanceItem, SharedStreamManager, SharedStreamProducer
from ackgate.testing import ScriptedProducer

from .conftest import outcomes, turn


def _advancers() -> list[asyncio.Task[Any]]:
    return [
        task
        for task in asyncio.all_tasks()
        if task.get_coro().__qualname__ == "LaneTracker._advancer"  # type: ignore[union-attr]
    ]


class _OverlapProducer(ScriptedProducer):
    """Records whether ``aclose()`` ever ran while an ``advance`` was in flight."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(lane=lambda payload: payload % 4)
        self.rng = rng
        self.overlaps = 0
        self.advanced_after_close = 0

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if self.closed:
            self.advanced_after_close += 1
        self.in_flight += 1
        try:
            for _ in range(self.rng.randrange(3)):
                await asyncio.sleep(0)
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        if self.in_flight:
            self.overlaps += 1
        await super().aclose()


async def _cancelled_while_resolving(seed: int, cap: int) -> tuple[_OverlapProducer, int]:
    rng = random.Random(seed)
    producer = _OverlapProducer(rng)
    for i in range(rng.randrange(10, 40)):
        producer.feed(i, i)
    to_confirm: list[int] = []
    async with SharedStreamManager(max_concurrent_advances=cap) as manager:

        async def consume(name: str) -> None:
            async with manager.subscribe("k", name, producer=lambda: producer) as sub:
                async for _ in sub:
                    seq = sub.bind()
                    if seq is not None:
                        to_confirm.append(seq)
                    for _ in range(rng.randrange(3)):
                        await asyncio.sleep(0)

        async def confirm() -> None:  # resolutions keep landing, during the stop too
            while True:
                if to_confirm:
                    manager.confirm_persisted([to_confirm.pop(rng.randrange(len(to_confirm)))])
                await asyncio.sleep(0)

        confirmer = asyncio.create_task(confirm())
        tasks = [asyncio.create_task(consume(f"s{i}")) for i in range(3)]
        for task in tasks:
            await turn(rng.randrange(8))
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    leftover = len(_advancers())
    confirmer.cancel()
    await asyncio.gather(confirmer, return_exceptions=True)
    return producer, leftover


@pytest.mark.parametrize("cap", [2, 4])
async def test_no_advance_overlaps_aclose_and_no_worker_outlives_the_stop(cap: int) -> None:
    for seed in range(150):
        producer, leftover = await _cancelled_while_resolving(seed, cap)
        assert producer.overlaps == 0, f"seed {seed}: aclose() ran during an advance"
        assert producer.advanced_after_close == 0, f"seed {seed}: advanced after aclose()"
        assert producer.closed == 1, f"seed {seed}"
        assert leftover == 0, f"seed {seed}: a LaneTracker worker outlived manager.aclose()"


class _BusyProducer(SharedStreamProducer):
    """An upstream that always has the next event ready; its ``finally`` awaits."""

    def __init__(self, finally_turns: int) -> None:
        self.finally_turns = finally_turns
        self.finally_started = 0
        self.finally_done = 0

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        i = 0
        try:
            while True:
                yield i, i
                i += 1
                if i % 7 == 0:
                    await asyncio.sleep(0)
        finally:
            self.finally_started += 1
            for _ in range(self.finally_turns):
                await asyncio.sleep(0)
            self.finally_done += 1

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        pass


async def test_open_stream_finally_runs_to_its_end_when_the_upstream_is_busy() -> None:
    rng = random.Random(6)
    for trial in range(50):
        producer = _BusyProducer(finally_turns=rng.randrange(1, 4))
        async with (
            SharedStreamManager(subscriber_queue_size=100_000) as manager,
            manager.subscribe("k", "s", producer=lambda p=producer: p) as sub,
        ):
            for _ in range(rng.randrange(1, 50)):
                await anext(sub)
            await turn(rng.randrange(3))
        assert (producer.finally_started, producer.finally_done) == (1, 1), f"trial {trial}"


async def test_fast_path_source_finally_runs_to_its_end_when_busy() -> None:
    closed: list[int] = []

    async def source() -> AsyncIterator[int]:
        i = 0
        try:
            while True:
                yield i
                i += 1
        finally:
            await asyncio.sleep(0)
            closed.append(i)

    for trial in range(30):
        closed.clear()
        async with (
            SharedStreamManager(subscriber_queue_size=100_000) as manager,
            manager.subscribe("k", "s", source=source) as sub,
        ):
            for _ in range(trial + 1):
                await anext(sub)
        assert len(closed) == 1, f"trial {trial}"


async def _leave_with_an_unconfirmed_output(
    manager: SharedStreamManager, stop: str
) -> tuple[weakref.ref[Any], weakref.ref[Any]]:
    producer = ScriptedProducer()
    producer.feed("a", 0)
    producer.feed("b", 1)
    sub = manager.subscribe("k", "s", producer=lambda: producer)

    async def consume() -> None:  # a task of its own: its context holds the subscription
        await anext(sub)
        assert sub.bind() is not None  # never confirmed
        if stop == "last subscriber left":
            await sub.aclose()  # clean: moved past it, the output still unconfirmed

    await asyncio.create_task(consume())
    return weakref.ref(sub._group), weakref.ref(producer)


@pytest.mark.parametrize("stop", ["last subscriber left", "manager closed"])
async def test_a_stopped_group_with_an_unconfirmed_output_is_freed(stop: str) -> None:
    manager = SharedStreamManager()
    group, producer = await _leave_with_an_unconfirmed_output(manager, stop)
    await manager.aclose()
    await turn()  # let the loop drop its handles to finished tasks
    gc.collect()
    assert group() is None, "the output registry still holds the group"
    assert producer() is None
    assert not manager._bindings._by_seq


async def test_advances_survive_their_advancers_cancellation() -> None:
    """docs/production.md#handler-mistakes: asyncio.run() cancels every task when main() ends, the
    advancers included; the group's stop still advances what was resolved, and returns."""
    producer = ScriptedProducer(lane=lambda payload: payload)
    for n in range(3):
        producer.feed(b"%d" % n, n)
    async with asyncio.timeout(10), SharedStreamManager() as manager:
        subscription = manager.subscribe("k", "s", producer=lambda: producer)
        events = aiter(subscription)
        for _ in range(3):
            await anext(events)  # each pull resolves the event before it
        advancers = _advancers()
        assert advancers, "a resolved event has an advancer on its way to advance it"
        for advancer in advancers:
            advancer.cancel()  # as asyncio.run() does, before the group's stop begins
        # The last member leaves: aclose() returns once the group stopped.
        leaving = asyncio.ensure_future(subscription.aclose())
        done, _ = await asyncio.wait([leaving], timeout=5)
        if not done:  # the regression: the stop waits for advancers that are gone
            stop = subscription._group.stop_task
            assert stop is not None
            stop.cancel()  # so that leaving the manager does not hang too
            pytest.fail("the group's stop waited for advances that never came")
    assert sorted(outcomes(producer)) == [0, 1, 2]
    assert all(outcome.is_clean for outcome in outcomes(producer).values())
    assert producer.closed == 1
