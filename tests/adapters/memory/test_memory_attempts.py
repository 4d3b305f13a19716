"""``Message.attempt`` on the memory broker (docs/failure-semantics.md#poison-messages): the broker
counts the deliveries of each record to a consumer group, across the group's producers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer, Position

FAILED = AdvanceOutcome(acked=0, failed=1, rejected=0)


async def delivery(
    producer: MemoryStreamProducer, stream: AsyncIterator[tuple[Any, Any]]
) -> tuple[bytes, int | None, Position]:
    raw, position = await anext(stream)
    return raw, producer.to_message(raw, position).attempt, position


async def test_attempt_counts_deliveries_across_seek_backs_and_producers() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", partitions=1)
    broker.publish("t", b"a")
    broker.publish("t", b"b")

    first = MemoryStreamProducer(broker, "t", "g")
    stream = first.open_stream()
    a = await delivery(first, stream)
    b = await delivery(first, stream)
    await first.advance([AdvanceItem(a[2], FAILED)])  # held: sought back to "a"
    again = await delivery(first, stream)
    await first.aclose()
    assert [d[:2] for d in (a, b, again)] == [(b"a", 1), (b"b", 1), (b"a", 2)]

    second = MemoryStreamProducer(broker, "t", "g")  # a restart: from the committed offset
    stream = second.open_stream()
    assert [(await delivery(second, stream))[:2] for _ in range(2)] == [(b"a", 3), (b"b", 2)]
    await second.aclose()

    other = MemoryStreamProducer(broker, "t", "other")  # another group counts its own
    assert (await delivery(other, other.open_stream()))[:2] == (b"a", 1)
