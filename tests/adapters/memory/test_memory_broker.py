"""MemoryBroker and MemoryStreamProducer driven directly, without the manager."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer, Position

ACK = AdvanceOutcome(acked=2, failed=0, rejected=0)
FAIL = AdvanceOutcome(acked=1, failed=1, rejected=0)
REJECT = AdvanceOutcome(acked=1, failed=0, rejected=1)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)


def broker_with(values: list[Any], partitions: int = 1) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic("t", partitions)
    for value in values:
        broker.publish("t", value, key=None if partitions == 1 else str(value))
    return broker


async def take(stream: AsyncIterator[tuple[Any, Any]], n: int) -> list[tuple[Any, Position]]:
    async with asyncio.timeout(2):
        return [await anext(stream) for _ in range(n)]


def test_partition_is_crc32_of_the_key_and_agrees_across_key_types() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 5)
    assert broker.partition_for("t", "user-42") == zlib.crc32(b"user-42") % 5
    assert broker.partition_for("t", b"user-42") == broker.partition_for("t", "user-42")
    assert broker.partition_for("t", 1234) == zlib.crc32(b"1234") % 5
    # Known values: a salted hash() would change them from one process to the next.
    assert [broker.partition_for("t", f"k{n}") for n in range(6)] == [
        zlib.crc32(f"k{n}".encode()) % 5 for n in range(6)
    ]
    with pytest.raises(TypeError):
        broker.publish("t", "v", key=1.5)  # type: ignore[arg-type]


def test_same_key_keeps_order_in_one_partition_and_unkeyed_round_robins() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 3)
    positions = [broker.publish("t", n, key="same") for n in range(4)]
    assert {p.partition for p in positions} == {broker.partition_for("t", "same")}
    assert [p.offset for p in positions] == [0, 1, 2, 3]
    assert [broker.publish("t", n).partition for n in range(3)] == [0, 1, 2]
    assert broker.end_offsets("t")[broker.partition_for("t", "same")] >= 4


def test_topics_must_exist_and_keep_their_partition_count() -> None:
    broker = MemoryBroker()
    with pytest.raises(ValueError, match="unknown topic"):
        broker.publish("nope", 1)
    broker.create_topic("t", 2)
    broker.create_topic("t", 2)
    with pytest.raises(ValueError, match="2 partitions"):
        broker.create_topic("t", 3)
    assert broker.records("t.dlq") == []


async def test_acked_events_are_committed_in_order() -> None:
    broker = broker_with(["a", "b", "c"])
    producer = MemoryStreamProducer(broker, "t", "g")
    got = await take(producer.open_stream(), 3)
    assert [value for value, _ in got] == ["a", "b", "c"]
    assert got[1][1] == Position("t", 0, 1)
    assert producer.get_advance_lane(got[1][1]) == 0
    await producer.advance([AdvanceItem(got[0][1], ACK)])
    assert broker.committed("t", "g") == {0: 1}
    await producer.advance([AdvanceItem(pos, ACK) for _, pos in got[1:]])
    assert broker.committed("t", "g") == {0: 3}
    assert producer.stats.committed == 3
    await producer.aclose()


async def test_rejected_events_go_to_the_dlq_with_reason_and_origin() -> None:
    broker = broker_with(["ok", "bad"])
    producer = MemoryStreamProducer(broker, "t", "g")
    got = await take(producer.open_stream(), 2)
    await producer.advance([AdvanceItem(got[0][1], ACK), AdvanceItem(got[1][1], REJECT)])
    assert broker.committed("t", "g") == {0: 2}
    [dead] = broker.records("t.dlq")
    assert dead.value == "bad"
    assert dead.origin == Position("t", 0, 1)
    assert dead.reason == "rejected by 1 of 2 subscribers"
    assert producer.stats.dead_lettered == 1


async def test_the_dead_letter_reason_carries_the_subscribers_reasons() -> None:
    broker = broker_with(["bad"])
    producer = MemoryStreamProducer(broker, "t", "g")
    ((_, position),) = await take(producer.open_stream(), 1)
    outcome = AdvanceOutcome(0, 0, 2, ("auditor: torn", "indexer: not JSON"))
    await producer.advance([AdvanceItem(position, outcome)])
    [dead] = broker.records("t.dlq")
    assert dead.reason == "rejected by 2 of 2 subscribers; auditor: torn; indexer: not JSON"
    await producer.aclose()


@pytest.mark.parametrize("outcome", [FAIL, NOBODY, AdvanceOutcome(0, 1, 1)], ids=str)
async def test_hold_seeks_back(outcome: AdvanceOutcome) -> None:
    broker = broker_with(["a", "b", "c", "d", "e"])
    producer = MemoryStreamProducer(broker, "t", "g")
    stream = producer.open_stream()
    first = await take(stream, 5)
    pos = [p for _, p in first]
    await producer.advance([AdvanceItem(pos[0], ACK), AdvanceItem(pos[1], outcome)])
    # Later events resolved after the hold change nothing: they come again.
    await producer.advance([AdvanceItem(pos[2], ACK), AdvanceItem(pos[3], REJECT)])
    assert broker.committed("t", "g") == {0: 1}
    assert broker.records("t.dlq") == []
    again = await take(stream, 4)
    assert [value for value, _ in again] == ["b", "c", "d", "e"]
    await producer.advance([AdvanceItem(pos[4], ACK)])  # the first copy of "e"
    assert broker.committed("t", "g") == {0: 1}
    outcomes = [ACK, ACK, REJECT, ACK]
    await producer.advance([AdvanceItem(p, o) for (_, p), o in zip(again, outcomes, strict=True)])
    assert broker.committed("t", "g") == {0: 5}
    assert [r.origin for r in broker.records("t.dlq")] == [Position("t", 0, 3)]
    stats = producer.stats
    assert (stats.delivered, stats.redelivered, stats.held, stats.discarded) == (9, 4, 1, 3)


async def test_seek_back_wakes_a_waiting_stream() -> None:
    broker = broker_with(["a"])
    producer = MemoryStreamProducer(broker, "t", "g")
    stream = producer.open_stream()
    [(_, pos)] = await take(stream, 1)
    waiting = asyncio.ensure_future(anext(stream))
    await producer.advance([AdvanceItem(pos, FAIL)])
    async with asyncio.timeout(2):
        assert await waiting == ("a", pos)


async def test_new_records_wake_a_waiting_stream() -> None:
    broker = broker_with([])
    producer = MemoryStreamProducer(broker, "t", "g")
    waiting = asyncio.ensure_future(anext(producer.open_stream()))
    position = broker.publish("t", "late")
    async with asyncio.timeout(2):
        assert await waiting == ("late", position)


async def test_a_hold_blocks_only_its_own_partition() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    for n in range(4):
        broker.publish("t", n)  # round-robin: 0 and 2 in partition 0, 1 and 3 in partition 1
    producer = MemoryStreamProducer(broker, "t", "g")
    got = dict(await take(producer.open_stream(), 4))
    await producer.advance([AdvanceItem(got[0], FAIL), AdvanceItem(got[2], ACK)])
    await producer.advance([AdvanceItem(got[1], ACK), AdvanceItem(got[3], ACK)])
    assert broker.committed("t", "g") == {0: 0, 1: 2}


async def test_commit_only_moves_forward() -> None:
    broker = broker_with(["a", "b"])
    old = MemoryStreamProducer(broker, "t", "g")
    new = MemoryStreamProducer(broker, "t", "g")
    [(_, a_old)] = await take(old.open_stream(), 1)
    [(_, a_new)] = await take(new.open_stream(), 1)
    await new.advance([AdvanceItem(a_new, ACK)])
    await old.advance([AdvanceItem(a_old, FAIL)])  # a duplicate behind the commit
    assert broker.committed("t", "g") == {0: 1}
    assert old.stats.discarded == 1


async def test_a_new_producer_resumes_from_committed_offsets() -> None:
    broker = broker_with(["a", "b", "c"])
    first = MemoryStreamProducer(broker, "t", "g")
    got = await take(first.open_stream(), 3)
    await first.advance([AdvanceItem(got[0][1], ACK)])
    await first.aclose()
    second = MemoryStreamProducer(broker, "t", "g")
    again = await take(second.open_stream(), 2)
    assert [value for value, _ in again] == ["b", "c"]
    assert second.stats.redelivered == 2
    other_group = await take(MemoryStreamProducer(broker, "t", "other").open_stream(), 1)
    assert other_group[0][0] == "a"


async def test_open_stream_is_called_once() -> None:
    producer = MemoryStreamProducer(broker_with([]), "t", "g")
    producer.open_stream()
    with pytest.raises(RuntimeError):
        producer.open_stream()


async def test_wait_drained_follows_commits_and_new_records() -> None:
    broker = broker_with(["a"])
    producer = MemoryStreamProducer(broker, "t", "g")
    stream = producer.open_stream()
    drained = asyncio.ensure_future(broker.wait_drained("t", "g"))
    [(_, a)] = await take(stream, 1)
    broker.publish("t", "b")
    await producer.advance([AdvanceItem(a, ACK)])
    [(_, b)] = await take(stream, 1)
    assert not drained.done()
    await producer.advance([AdvanceItem(b, ACK)])
    async with asyncio.timeout(2):
        await drained
    assert broker.committed("t", "g") == broker.end_offsets("t") == {0: 2}
