"""docs/writing-an-adapter.md#1-the-producer on genuine Kafka: a stream suspended at a yield stays
in the consumer group.

Every test uses ``max_poll_interval_ms=3000`` and suspends the stream far longer. Without
the adapter's keeper, aiokafka leaves the group after 3 s: the partitions are revoked
and reassigned, the position falls back to the last commit and the same records are
handed out again (or a commit fails and the group ends).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from ackgate import AdvanceItem, AdvanceOutcome, SharedStreamManager, Subscription
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster

MAX_POLL_INTERVAL_MS = 3000
SUSPENSION = 10.0


def factory(
    kafka: KafkaTestCluster, topic: str, group: str, made: list[KafkaStreamProducer]
) -> Any:
    def make() -> KafkaStreamProducer:
        producer = KafkaStreamProducer(
            topic,
            bootstrap_servers=kafka.bootstrap,
            group_id=group,
            max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            rebalance_drain_timeout=1.0,
        )
        made.append(producer)
        return producer

    return make


def membership_changes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ackgate.adapters.kafka" and r.getMessage().startswith("Partitions revoked")
    ]


async def stop(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


async def test_paused_roster_group_keeps_membership_for_three_poll_intervals(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A member leaves for 10 s: the group pauses, the stream waits at a yield, nothing
    is revoked, and afterwards every message reaches each member exactly once."""
    caplog.set_level(logging.INFO, logger="ackgate.adapters.kafka")
    topic, group = kafka.unique("suspend-roster"), kafka.unique("g")
    partitions, count, leave_after = 2, 300, 50
    await kafka.create_topic(topic, partitions)
    await kafka.produce(topic, count, partitions)
    made: list[KafkaStreamProducer] = []
    make = factory(kafka, topic, group, made)
    roster = {"a", "b"}
    seen: dict[str, Counter[int]] = {"a": Counter(), "b": Counter()}
    away = 0.0

    async def read(sub: Subscription, sid: str, limit: int | None = None) -> None:
        async with sub:
            async for record in sub:
                seen[sid][int(record.value)] += 1
                if limit is not None and sum(seen[sid].values()) == limit:
                    break  # a clean leave: the event it is on counts as handled

    async def member_b() -> None:
        nonlocal away
        await read(manager.subscribe(topic, "b", producer=make, roster=roster), "b", leave_after)
        left = time.monotonic()
        await asyncio.sleep(SUSPENSION)  # the length of the absence under test
        away = time.monotonic() - left
        await read(manager.subscribe(topic, "b", producer=make, roster=roster), "b")

    async with SharedStreamManager() as manager:
        sub_a = manager.subscribe(topic, "a", producer=make, roster=roster)
        tasks = [asyncio.create_task(read(sub_a, "a")), asyncio.create_task(member_b())]
        try:
            async with asyncio.timeout(90):
                await kafka.wait_committed_to_end(group, topic, partitions)
            revoked = membership_changes(caplog)  # before the group stops and leaves
        finally:
            await stop(tasks)

    assert away >= SUSPENSION
    assert len(made) == 1, "the group restarted"
    assert revoked == [], "the consumer left its group while suspended"
    for sid in roster:
        duplicates = {n: c for n, c in seen[sid].items() if c != 1}
        assert set(seen[sid]) == set(range(count)), f"{sid} missed messages"
        assert duplicates == {}, f"{sid} was handed messages again: {duplicates}"
    assert made[0]._keeper is not None and made[0]._keeper.suspensions >= 1


async def test_backpressure_with_one_eight_second_handler_call(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's reproduction: overflow="block", queues of 2, one 8 s handler call."""
    caplog.set_level(logging.INFO, logger="ackgate.adapters.kafka")
    topic, group = kafka.unique("suspend-block"), kafka.unique("g")
    partitions, count, slow_at = 2, 100, 10
    await kafka.create_topic(topic, partitions)
    await kafka.produce(topic, count, partitions)
    made: list[KafkaStreamProducer] = []
    make = factory(kafka, topic, group, made)
    seen: dict[str, Counter[int]] = {"fast": Counter(), "slow": Counter()}
    slow_call = 0.0

    async def read(sub: Subscription, sid: str) -> None:
        nonlocal slow_call
        async with sub:
            async for record in sub:
                n = int(record.value)
                seen[sid][n] += 1
                if sid == "slow" and n == slow_at:
                    started = time.monotonic()
                    await asyncio.sleep(8.0)  # the slow handler call under test
                    slow_call = time.monotonic() - started

    async with SharedStreamManager(
        overflow="block", subscriber_queue_size=2, cohort_grace_period=0.2
    ) as manager:
        subs = {sid: manager.subscribe(topic, sid, producer=make) for sid in seen}
        tasks = [asyncio.create_task(read(subs[sid], sid)) for sid in seen]
        try:
            async with asyncio.timeout(90):
                await kafka.wait_committed_to_end(group, topic, partitions)
            revoked = membership_changes(caplog)  # before the group stops and leaves
        finally:
            await stop(tasks)

    assert slow_call >= 8.0
    assert len(made) == 1, "the group restarted"
    assert revoked == [], "the consumer left its group while suspended"
    for sid, counts in seen.items():
        assert set(counts) == set(range(count)), f"{sid} missed messages"
        assert max(counts.values()) == 1, f"{sid} was handed messages again"
    assert made[0]._keeper is not None and made[0]._keeper.suspensions >= 1


async def wait_until(condition: Any, what: str) -> None:
    """Poll a condition on the producer's state (it offers nothing to await)."""
    async with asyncio.timeout(30):
        while not condition():  # noqa: ASYNC110 - the producer's state has no event to await
            await asyncio.sleep(0.05)
    assert condition(), what


async def test_rebalance_while_suspended_pauses_new_partitions_and_skips_nothing(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """While the stream waits at a yield, a second member joins then leaves the group:
    the partitions that come back are paused until the stream resumes, and it then
    yields every record after the committed offsets exactly once."""
    caplog.set_level(logging.INFO, logger="ackgate.adapters.kafka")
    topic, group = kafka.unique("suspend-rebalance"), kafka.unique("g")
    partitions, count = 2, 40
    await kafka.create_topic(topic, partitions)
    await kafka.produce(topic, count, partitions)
    made: list[KafkaStreamProducer] = []
    producer = factory(kafka, topic, group, made)()
    stream = producer.open_stream()
    try:
        async with asyncio.timeout(30):
            first = [await anext(stream) for _ in range(4)]
        by_lane: dict[Any, list[Any]] = {}
        for _, delivery in first:
            by_lane.setdefault(producer.get_advance_lane(delivery), []).append(delivery)
        acked = AdvanceOutcome(acked=1, failed=0, rejected=0)
        for lane in by_lane.values():
            await producer.advance([AdvanceItem(d, acked) for d in lane])
        keeper = producer._keeper
        assert keeper is not None
        await wait_until(lambda: keeper.keeping, "the keeper never took over")

        other = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        )
        await other.start()
        try:
            async with asyncio.timeout(30):
                while not other.assignment():
                    await other.getmany(timeout_ms=100)
        finally:
            await other.stop()  # leaves the group: everything comes back to us
        await wait_until(
            lambda: len(consumer_paused(producer)) == partitions,
            "the partitions assigned back were not paused",
        )
        assert keeper.keeping, "the stream was resumed by the rebalance"
        assert membership_changes(caplog), "no rebalance happened: nothing was tested"

        committed = await kafka.committed(group)
        expected = {
            (tp.partition, offset)
            for tp, end in (await kafka.end_offsets(topic, partitions)).items()
            for offset in range(committed.get(tp, 0), end)
        }
        rest: Counter[tuple[int, int]] = Counter()
        async with asyncio.timeout(30):
            while set(rest) != expected:
                record, _ = await anext(stream)
                rest[record.partition, record.offset] += 1
    finally:
        await stream.aclose()
        await producer.aclose()
    assert max(rest.values()) == 1
    assert len(expected) == count - 4


def consumer_paused(producer: KafkaStreamProducer) -> set[Any]:
    paused: set[Any] = producer._consumer.paused()
    return paused
