"""SubscriberProgress: what each roster member acked, by event id, read by a producer
and seeded into a group's next life (docs/concepts.md#redelivery-memory)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from typing import Any

from ackgate import EventBatch, IdRange, SharedStreamManager, SubscriberProgress
from ackgate.testing import ScriptedProducer

from .conftest import turn

PREFIX = ("t", 0)


class OffsetProducer(ScriptedProducer):
    """Payloads are offsets of one partition; ids ``("t", 0, offset)``. ``seed`` is
    handed to the group as soon as it gives its progress, before anything is read."""

    def __init__(self, seed: Mapping[Hashable, Sequence[tuple[int, int]]] | None = None) -> None:
        super().__init__()
        self.seed = seed
        self.progress: SubscriberProgress | None = None

    def get_event_id(self, broker_payload: Any) -> Hashable:
        return (*PREFIX, broker_payload)

    def _watch_subscriber_progress(self, progress: SubscriberProgress | None) -> None:
        super()._watch_subscriber_progress(progress)
        if progress is not None:
            self.progress = progress
            if self.seed is not None:
                progress.seed_acked(PREFIX, self.seed)


class RangeProducer(OffsetProducer):
    """Yields one batch per ``feed_range(first, stop)``: offsets ``first .. stop - 1``,
    their ids an :class:`~ackgate.IdRange` (the group remembers them as a span)."""

    def feed_range(self, first: int, stop: int) -> None:
        self.feed("range", (first, stop))

    def open_stream_batches(self) -> AsyncIterator[EventBatch]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[EventBatch]:
        async for _, (first, stop) in super().open_stream():
            offsets = list(range(first, stop))
            yield EventBatch(offsets, offsets, None, IdRange(PREFIX, first, stop - first))


async def test_a_producer_reads_what_each_member_acked_and_a_reject_is_not_in_it(
    manager: SharedStreamManager,
) -> None:
    producer = OffsetProducer()
    roster = ("a", "b")
    a = manager.subscribe("k", "a", producer=lambda: producer, roster=roster)
    b = manager.subscribe("k", "b", producer=lambda: producer, roster=roster)
    for offset in range(6):
        producer.feed(f"e{offset}", offset)
    for _ in range(6):
        await anext(a)
    await anext(b)  # 0
    await anext(b)  # 1, acking 0
    b.reject()  # 1
    await anext(b)  # 2
    await anext(b)  # 3, acking 2
    await turn()
    assert producer.progress is not None
    assert producer.progress.acked_offsets(PREFIX, 0) == {"a": [(0, 5)], "b": [(0, 1), (2, 3)]}
    # Asked past an offset, nothing below it is answered any more.
    assert producer.progress.acked_offsets(PREFIX, 3) == {"a": [(3, 5)]}
    assert producer.progress.acked_offsets(("t", 1), 0) == {}


async def test_a_run_in_progress_counts_what_was_acked_of_it(manager: SharedStreamManager) -> None:
    producer = RangeProducer()
    roster = ("a", "b")
    a = manager.subscribe("k", "a", producer=lambda: producer, roster=roster)
    b = manager.subscribe("k", "b", producer=lambda: producer, roster=roster)
    producer.feed_range(0, 4)
    for _ in range(4):
        await anext(a)
    await turn()
    assert producer.progress is not None
    # a is still busy with the run (its window on offset 3 is open): what it acked of
    # it is read from the run's state; b was handed nothing yet.
    assert producer.progress.acked_offsets(PREFIX, 0) == {"a": [(0, 3)]}
    for _ in range(4):
        await anext(b)
    producer.feed_range(4, 5)  # both move on, closing their windows on the run
    assert (await anext(a), await anext(b)) == (4, 4)
    await producer.wait_advanced(4)
    assert producer.progress.acked_offsets(PREFIX, 1) == {"a": [(1, 4)], "b": [(1, 4)]}


async def test_a_seeded_member_is_not_handed_what_it_acked_in_an_earlier_life(
    manager: SharedStreamManager,
) -> None:
    producer = RangeProducer(seed={"a": [(0, 3)], "b": [(1, 2)], "stranger": [(0, 5)]})
    roster = ("a", "b")
    a = manager.subscribe("k", "a", producer=lambda: producer, roster=roster)
    b = manager.subscribe("k", "b", producer=lambda: producer, roster=roster)
    producer.feed_range(0, 5)
    assert [await anext(a), await anext(a)] == [3, 4]
    assert [await anext(b) for _ in range(4)] == [0, 2, 3, 4]
    producer.feed_range(5, 6)  # closes the windows on 4
    assert (await anext(a), await anext(b)) == (5, 5)
    await producer.wait_advanced(5)
    assert all(item.outcome.acked == 2 for batch in producer.batches for item in batch)
    assert a.redeliveries_skipped == 3 and b.redeliveries_skipped == 1
    # The seeds are acks like any other: a producer reads them back.
    assert producer.progress is not None
    assert producer.progress.acked_offsets(PREFIX, 0)["a"] == [(0, 5)]


async def test_a_dynamic_group_neither_reports_nor_takes_progress(
    manager: SharedStreamManager,
) -> None:
    producer = OffsetProducer(seed={"a": [(0, 3)]})
    a = manager.subscribe("k", "a", producer=lambda: producer)
    for offset in range(3):
        producer.feed(f"e{offset}", offset)
    assert [await anext(a) for _ in range(3)] == ["e0", "e1", "e2"]  # the seed is ignored
    await producer.wait_advanced(2)
    assert producer.progress is not None
    assert producer.progress.roster is None
    assert producer.progress.acked_offsets(PREFIX, 0) == {}
