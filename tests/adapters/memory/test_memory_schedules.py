"""Random advance schedules against MemoryStreamProducer: nothing is committed that was
not handled, every rejected record is dead-lettered exactly once, and the topic drains."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from ackgate import AdvanceItem, AdvanceOutcome
from ackgate.adapters.memory import MemoryBroker, MemoryStreamProducer, Position

ACK = AdvanceOutcome(acked=1, failed=0, rejected=0)
FAIL = AdvanceOutcome(acked=0, failed=1, rejected=0)
REJECT = AdvanceOutcome(acked=0, failed=0, rejected=1)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)


def poisonous(value: int) -> bool:
    return value % 7 == 3


async def run_schedule(data: st.DataObject, partitions: int, count: int) -> None:
    broker = MemoryBroker()
    broker.create_topic("t", partitions)
    positions = {broker.publish("t", n, key=n % 5): n for n in range(count)}
    producer = MemoryStreamProducer(broker, "t", "g")
    stream = producer.open_stream()
    in_flight: list[tuple[int, Position]] = []
    handled: set[Position] = set()  # advanced at least once as acked or rejected
    failures_left = data.draw(st.integers(0, 12), label="failure budget")
    for _ in range(1000):
        if broker.committed("t", "g") == broker.end_offsets("t"):
            break
        # White-box: the stream blocks when no partition has a record to fetch.
        fetchable = sum(
            max(0, len(broker.records("t", p)) - producer._fetch[p]) for p in range(partitions)
        )
        take = data.draw(st.integers(0 if in_flight else 1, 4), label="take")
        for _ in range(min(fetchable, take)):
            async with asyncio.timeout(1):
                value, position = await anext(stream)
            in_flight.append((value, position))
        if not in_flight:
            continue
        items = []
        for value, position in in_flight[: data.draw(st.integers(1, len(in_flight)))]:
            if failures_left and data.draw(st.booleans(), label="fails"):
                failures_left -= 1
                outcome = data.draw(st.sampled_from([FAIL, NOBODY]))
            else:
                outcome = REJECT if poisonous(value) else ACK
                handled.add(position)
            items.append(AdvanceItem(position, outcome))
        del in_flight[: len(items)]
        await producer.advance(items)
        for p, committed in broker.committed("t", "g").items():
            assert all(Position("t", p, offset) in handled for offset in range(committed))
    assert broker.committed("t", "g") == broker.end_offsets("t")
    origins = [record.origin for record in broker.records("t.dlq")]
    expected = {position for position, value in positions.items() if poisonous(value)}
    assert len(origins) == len(set(origins))
    assert set(origins) == expected
    stats = producer.stats
    assert stats.committed + stats.dead_lettered == count


@settings(max_examples=60, deadline=None)
@given(data=st.data(), partitions=st.integers(1, 3), count=st.integers(1, 25))
def test_random_schedules_drain_and_dead_letter_once(
    data: st.DataObject, partitions: int, count: int
) -> None:
    asyncio.run(run_schedule(data, partitions, count))
