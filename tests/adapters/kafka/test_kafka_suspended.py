"""SPEC §10 on genuine Kafka: a stream suspended at a yield stays in the consumer group.

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

from ackgate import SharedStreamManager, Subscription
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
