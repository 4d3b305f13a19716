"""KafkaStreamProducer.advance_runs against the real broker: the same broker result as
advance for the same events, and a clean run committed without reading its events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, overload

import pytest
from aiokafka.structs import TopicPartition

from ackgate import AdvanceOutcome, AdvanceRun, IdRange
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster
from .test_kafka_producer import ACK, FAIL, puller, spy_commits

Advance = Callable[[KafkaStreamProducer, list[AdvanceRun]], Awaitable[None]]


async def by_runs(producer: KafkaStreamProducer, runs: list[AdvanceRun]) -> None:
    await producer.advance_runs(runs)


async def by_items(producer: KafkaStreamProducer, runs: list[AdvanceRun]) -> None:
    await producer.advance([item for run in runs for item in run.items()])


both = pytest.mark.parametrize("advance", [by_runs, by_items], ids=["advance_runs", "advance"])


class EndsOnly(Sequence[Any]):
    """Payloads that fail the test if anything but the first and last is read."""

    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        assert isinstance(index, int) and index in (0, -1, len(self) - 1), index
        return self._items[index]

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("a clean run was read event by event")


async def test_a_clean_run_commits_to_its_end_in_one_commit_without_reading_it(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("run"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 300, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    batches = producer.open_stream_batches()
    try:
        payloads: list[Any] = []
        while len(payloads) < 300:
            batch = await anext(batches)
            # No gap in a fresh topic's offsets: the ids are one interval.
            assert isinstance(batch.event_ids, IdRange), batch.event_ids
            assert batch.event_ids.first == len(payloads)
            payloads.extend(batch.broker_payloads)
        commits = spy_commits(producer)
        await producer.advance_runs([AdvanceRun(EndsOnly(payloads), ACK)])
        assert commits == [{tp: 300}]
        assert await kafka.committed(group) == {tp: 300}
    finally:
        await batches.aclose()
        await producer.aclose()


@both
async def test_a_failure_inside_a_run_holds_there_and_the_rest_is_finished(
    kafka: KafkaTestCluster, advance: Advance
) -> None:
    topic, group = kafka.unique("runhold"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 10, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    pull = puller(stream)
    try:
        first = [p for _, p in await pull(10)]
        commits = spy_commits(producer)
        # 0..6 in one run, 4 failed: committed up to 4 and held there; 5, 6 finished.
        await advance(producer, [AdvanceRun(first[:7], ACK, {4: FAIL})])
        assert commits == [{tp: 4}]
        # 7..9 were fetched before the hold: a stale run, finished, not committed past 4.
        await advance(producer, [AdvanceRun(first[7:], ACK)])
        assert commits == [{tp: 4}, {tp: 4}]
        # Only 4 comes back (5..9 are finished), as its second attempt.
        (again,) = [p for _, p in await pull(1)]
        assert (again.record.offset, again.attempt) == (4, 2)
        await advance(producer, [AdvanceRun([again], ACK)])
        assert commits[-1] == {tp: 10}
        assert await kafka.committed(group) == {tp: 10}
    finally:
        await stream.aclose()
        await producer.aclose()


@both
async def test_a_run_straddling_a_hold_commits_the_new_copies_in_order(
    kafka: KafkaTestCluster, advance: Advance
) -> None:
    topic, group = kafka.unique("runepoch"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 6, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    pull = puller(stream)
    try:
        first = [p for _, p in await pull(6)]
        commits = spy_commits(producer)
        await advance(producer, [AdvanceRun(first[:3], ACK, {2: FAIL})])
        assert commits == [{tp: 2}]
        # Nothing after the hold is finished yet, so 2..5 are all fetched again; the
        # lane's next run holds the stale 3..5, then the new copies of 2..5.
        refetched = [p for _, p in await pull(4)]
        assert [p.record.offset for p in refetched] == [2, 3, 4, 5]
        await advance(producer, [AdvanceRun(first[3:] + refetched, ACK)])
        assert commits[-1] == {tp: 6}
        assert await kafka.committed(group) == {tp: 6}
    finally:
        await stream.aclose()
        await producer.aclose()


@both
async def test_a_reject_inside_a_run_reaches_the_dlq_with_its_reason(
    kafka: KafkaTestCluster, advance: Advance
) -> None:
    topic, dlq, group = kafka.unique("runrej"), kafka.unique("dlq"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.create_topic(dlq, 1)
    await kafka.produce(topic, 5, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaStreamProducer(
        topic, bootstrap_servers=kafka.bootstrap, group_id=group, dlq_topic=dlq
    )
    stream = producer.open_stream()
    try:
        events = await puller(stream)(5)
        rejected = AdvanceOutcome(acked=1, failed=0, rejected=1, reasons=("s0: not JSON",))
        await advance(producer, [AdvanceRun([p for _, p in events], ACK, {2: rejected})])
        (dead,) = await kafka.read_all(dlq, 1)
        assert dead.value == events[2][0].value
        headers = dict(dead.headers)
        assert headers["ackgate.original.offset"] == b"2"
        assert headers["ackgate.reason"] == b"rejected by 1 of 2 subscribers: s0: not JSON"
        assert await kafka.committed(group) == {tp: 5}
    finally:
        await stream.aclose()
        await producer.aclose()


@both
async def test_a_run_of_an_earlier_assignment_is_not_committed(
    kafka: KafkaTestCluster, advance: Advance
) -> None:
    topic, group = kafka.unique("runstale"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 4, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    try:
        events = [p for _, p in await puller(stream)(4)]
        await advance(producer, [AdvanceRun(events[:1], ACK)])
        # The partition is revoked and assigned back: a new epoch, a new assignment.
        await producer._on_revoked([tp])
        producer._own(tp)
        commits = spy_commits(producer)
        await advance(producer, [AdvanceRun(events[1:], ACK)])
        assert commits == []
        assert await kafka.committed(group) == {tp: 1}
    finally:
        await stream.aclose()
        await producer.aclose()
