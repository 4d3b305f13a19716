"""KafkaStreamProducer driven directly (open_stream / advance / aclose), against the real broker.

These pin the adapter's broker-side decisions without the engine: what is committed for
each outcome, one commit per batch, hold and redelivery, the DLQ copy, ownership on
rebalance, and the errors a user sees.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster

ACK = AdvanceOutcome(acked=2, failed=0, rejected=0)
FAIL = AdvanceOutcome(acked=1, failed=1, rejected=0)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)
REJECT = AdvanceOutcome(acked=1, failed=0, rejected=1)
FAST_GROUP: dict[str, Any] = {"heartbeat_interval_ms": 300, "session_timeout_ms": 6000}

Pull = Callable[[int], Awaitable[list[tuple[Any, Any]]]]


def puller(stream: AsyncIterator[tuple[Any, Any]]) -> Pull:
    async def pull(n: int) -> list[tuple[Any, Any]]:
        async with asyncio.timeout(30):
            return [await anext(stream) for _ in range(n)]

    return pull


def spy_commits(producer: KafkaStreamProducer) -> list[dict[Any, int]]:
    """Record the offsets of every commit call the producer makes (white-box: wraps its
    consumer; the offset map in the metadata is left out)."""
    calls: list[dict[Any, int]] = []
    consumer = producer._consumer
    real = consumer.commit

    async def commit(offsets: dict[Any, tuple[int, str]]) -> None:
        assigned = consumer.assignment()
        assert all(tp in assigned for tp in offsets), f"commit of unowned {offsets}"
        calls.append({tp: offset for tp, (offset, _) in offsets.items()})
        await real(offsets)

    consumer.commit = commit
    return calls


def test_auto_commit_is_refused_before_connecting() -> None:
    with pytest.raises(ValueError, match="enable_auto_commit"):
        KafkaStreamProducer(
            "t", bootstrap_servers="127.0.0.1:1", group_id="g", enable_auto_commit=True
        )


def test_deserializers_with_dlq_are_refused() -> None:
    with pytest.raises(ValueError, match="dlq_topic"):
        KafkaStreamProducer(
            "t",
            bootstrap_servers="127.0.0.1:1",
            group_id="g",
            dlq_topic="dlq",
            value_deserializer=bytes.decode,
        )


async def test_poll_error_ends_the_stream_loudly(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = kafka.unique("poll"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 1, 1)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    try:
        await puller(stream)(1)

        async def broken(**kwargs: Any) -> None:
            raise KafkaError("injected")

        producer._consumer.getmany = broken
        with pytest.raises(RuntimeError, match="poll failed") as info:
            await anext(stream)
        assert isinstance(info.value.__cause__, KafkaError)
        assert f"Kafka poll failed group={group}" in caplog.text
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_bad_bootstrap_is_a_clear_connection_error() -> None:
    producer = KafkaStreamProducer("t", bootstrap_servers="127.0.0.1:1", group_id="g")
    stream = producer.open_stream()
    try:
        with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:1.*cannot reach"):
            async with asyncio.timeout(60):
                await anext(stream)
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_a_bootstrap_host_that_does_not_resolve_is_named_unknown_host() -> None:
    producer = KafkaStreamProducer(
        "t", bootstrap_servers="no-such-broker.invalid:9092", group_id="g"
    )
    stream = producer.open_stream()
    try:
        with pytest.raises(
            ConnectionError, match=r"unknown host: 'no-such-broker\.invalid'.*cannot reach"
        ):
            async with asyncio.timeout(60):
                await anext(stream)
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_acked_commits_once_per_batch_and_failed_is_held_then_redelivered(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("hold"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 10, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    pull = puller(stream)
    try:
        first = await pull(10)
        commits = spy_commits(producer)
        assert [r.offset for r, _ in first] == list(range(10))
        assert {producer.get_advance_lane(p) for _, p in first} == {tp}

        await producer.advance([AdvanceItem(p, ACK) for _, p in first[:4]])
        assert commits == [{tp: 4}]

        # 4 acked, 5 failed, 6 acked: commit up to just before 5 and hold there.
        await producer.advance(
            [
                AdvanceItem(first[4][1], ACK),
                AdvanceItem(first[5][1], FAIL),
                AdvanceItem(first[6][1], ACK),
            ]
        )
        assert commits == [{tp: 4}, {tp: 5}]
        # 7..9 were fetched before the seek: acking them must not move past the hold,
        # but they are finished: the same offset is committed again with them in its map.
        await producer.advance([AdvanceItem(p, ACK) for _, p in first[7:]])
        assert commits == [{tp: 4}, {tp: 5}, {tp: 5}]
        assert [p.attempt for _, p in first] == [1] * 10

        # Only 5 comes back (6..9 are finished), as its second attempt, recorded in the
        # metadata (committed again) before it is yielded.
        again = await pull(1)
        assert [(r.offset, p.attempt) for r, p in again] == [(5, 2)]
        assert commits == [{tp: 4}, {tp: 5}, {tp: 5}, {tp: 5}]
        # The redelivered 5 reaches nobody this time: still held, no commit call needed.
        await producer.advance([AdvanceItem(again[0][1], NOBODY)])
        assert len(commits) == 4
        third = await pull(1)
        assert [(r.offset, p.attempt) for r, p in third] == [(5, 3)]
        # Acking 5 commits past the finished 6..9 at once.
        await producer.advance([AdvanceItem(p, ACK) for _, p in third])
        assert commits[-1] == {tp: 10}
        assert await kafka.committed(group) == {tp: 10}
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_reject_goes_to_dlq_with_headers_before_commit(kafka: KafkaTestCluster) -> None:
    topic, dlq, group = kafka.unique("rej"), kafka.unique("dlq"), kafka.unique("g")
    await kafka.create_topic(topic, 2)
    await kafka.create_topic(dlq, 1)
    await kafka.produce(topic, 6, 2)
    producer = KafkaStreamProducer(
        topic, bootstrap_servers=kafka.bootstrap, group_id=group, dlq_topic=dlq
    )
    stream = producer.open_stream()
    try:
        events = await puller(stream)(6)
        commits = spy_commits(producer)
        for partition in (0, 1):
            lane = [p for r, p in events if r.partition == partition]
            outcomes = [ACK, REJECT, ACK]
            await producer.advance([AdvanceItem(p, o) for p, o in zip(lane, outcomes, strict=True)])
        assert sorted(c[next(iter(c))] for c in commits) == [3, 3]
        dead = await kafka.read_all(dlq, 2)
        assert len(dead) == 2
        for record in dead:
            headers = dict(record.headers)
            original = next(
                r
                for r, _ in events
                if str(r.partition).encode() == headers["ackgate.original.partition"]
                and str(r.offset).encode() == headers["ackgate.original.offset"]
            )
            assert headers["ackgate.original.topic"] == topic.encode()
            assert headers["ackgate.original.offset"] == b"1"
            assert headers["ackgate.reason"] == b"rejected by 1 of 2 subscribers"
            assert record.value == original.value
    finally:
        await stream.aclose()
        await producer.aclose()


def rejected_for(*reasons: str) -> AdvanceOutcome:
    """An outcome rejected by ``len(reasons)`` of 3 subscribers, with
    docs/concepts.md#deferred-resolution reasons."""
    return AdvanceOutcome(acked=3 - len(reasons), failed=0, rejected=len(reasons), reasons=reasons)


async def test_dlq_reason_header_carries_the_rejecting_subscribers_reasons(
    kafka: KafkaTestCluster,
) -> None:
    topic, dlq, group = kafka.unique("reasons"), kafka.unique("dlq"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.create_topic(dlq, 1)
    await kafka.produce(topic, 2, 1)
    producer = KafkaStreamProducer(
        topic, bootstrap_servers=kafka.bootstrap, group_id=group, dlq_topic=dlq
    )
    stream = producer.open_stream()
    try:
        (_, first), (_, second) = await puller(stream)(2)
        outcomes = [
            rejected_for("auditor: malformed JSON", "schema: no field 'id'"),
            AdvanceOutcome(acked=2, failed=0, rejected=1),  # no reason given
        ]
        await producer.advance([AdvanceItem(first, outcomes[0]), AdvanceItem(second, outcomes[1])])
        dead = sorted(await kafka.read_all(dlq, 2), key=lambda r: r.value)
    finally:
        await stream.aclose()
        await producer.aclose()
    assert [dict(r.headers)["ackgate.reason"] for r in dead] == [
        b"rejected by 2 of 3 subscribers: auditor: malformed JSON; schema: no field 'id'",
        b"rejected by 1 of 3 subscribers",
    ]
    assert await kafka.committed(group) == {TopicPartition(topic, 0): 2}


async def test_reject_without_dlq_commits_with_warning(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = kafka.unique("rej"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 2, 1)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    try:
        events = await puller(stream)(2)
        with caplog.at_level(logging.WARNING, logger="ackgate.adapters.kafka"):
            await producer.advance(
                [AdvanceItem(events[0][1], REJECT), AdvanceItem(events[1][1], ACK)]
            )
        assert f"{topic}-0@0 committed past without a DLQ" in caplog.text
        assert await kafka.committed(group) == {TopicPartition(topic, 0): 2}
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_commit_error_is_logged_and_raised(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = kafka.unique("cerr"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 1, 1)
    producer = KafkaStreamProducer(topic, bootstrap_servers=kafka.bootstrap, group_id=group)
    stream = producer.open_stream()
    try:
        [(_, payload)] = await puller(stream)(1)

        async def broken(offsets: dict[Any, int]) -> None:
            raise KafkaError("injected")

        producer._consumer.commit = broken
        with pytest.raises(RuntimeError, match="commit failed") as info:
            await producer.advance([AdvanceItem(payload, ACK)])
        assert isinstance(info.value.__cause__, KafkaError)
        assert f"{topic}-0 offset=1" in caplog.text
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_rebalance_drains_resolved_prefix_and_never_commits_revoked(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("reb"), kafka.unique("g")
    await kafka.create_topic(topic, 2)
    await kafka.produce(topic, 20, 2)
    first = KafkaStreamProducer(
        topic,
        bootstrap_servers=kafka.bootstrap,
        group_id=group,
        rebalance_drain_timeout=3.0,
        **FAST_GROUP,
    )
    second = KafkaStreamProducer(
        topic,
        bootstrap_servers=kafka.bootstrap,
        group_id=group,
        rebalance_drain_timeout=3.0,
        **FAST_GROUP,
    )
    stream1, stream2 = first.open_stream(), second.open_stream()
    try:
        events = await puller(stream1)(20)
        commits = spy_commits(first)
        by_partition = {p: [d for r, d in events if r.partition == p] for p in (0, 1)}
        revoke_started, revoke_done = asyncio.Event(), asyncio.Event()
        real_on_revoked = first._on_revoked

        async def on_revoked(revoked: Any) -> None:
            revoke_started.set()
            await real_on_revoked(revoked)
            revoke_done.set()

        first._on_revoked = on_revoked  # type: ignore[method-assign]
        join = asyncio.create_task(anext(stream2))
        # While the revoke drains, partition 0's events are advanced: that must commit.
        async with asyncio.timeout(30):
            await revoke_started.wait()
        await first.advance([AdvanceItem(d, ACK) for d in by_partition[0][:5]])
        assert commits == [{TopicPartition(topic, 0): 5}]
        # After the drain gave up, nothing of the old assignment may be committed.
        async with asyncio.timeout(30):
            await revoke_done.wait()
        await first.advance([AdvanceItem(d, ACK) for d in by_partition[0][5:]])
        await first.advance([AdvanceItem(d, ACK) for d in by_partition[1]])
        assert commits == [{TopicPartition(topic, 0): 5}]
        # The new owner of each partition resumes at its committed offset.
        async with asyncio.timeout(60):
            record, _ = await join
        assert (record.partition, record.offset) in {(0, 5), (1, 0)}
    finally:
        for stream, producer in ((stream1, first), (stream2, second)):
            await stream.aclose()
            await producer.aclose()
