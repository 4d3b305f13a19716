"""Per-member progress in the offset map, on genuine Kafka: a consumer that takes the
partition over hands each roster member only what that member had not finished
(docs/adapters/kafka.md#the-offset-map).

Life 1: ``fast`` acks all 100 records, ``mid`` the first 70, ``slow`` the first 40, then
``mid`` and ``slow`` hang on their next record and the life ends without them resolving
it (nothing of the fetch is advanced meanwhile: the commit stays at 0, its map holds
each member's acks). Life 2, a new group with the
same roster: ``fast`` is handed nothing again, ``mid`` only offsets 70..99, ``slow``
only 40..99, and the partition is committed to its end.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from aiokafka.structs import TopicPartition

from ackgate import SharedStreamManager
from ackgate_kafka import KafkaStreamProducer
from ackgate_kafka._offset_map import OffsetMap, decode

from .kafka_testlib import KafkaTestCluster

ROSTER = ("fast", "mid", "slow")
COUNT = 100
LIMITS = {"fast": COUNT, "mid": 70, "slow": 40}


async def committed_map(kafka: KafkaTestCluster, group: str, tp: TopicPartition) -> object:
    """The decoded map of ``tp``'s commit (``None`` before the first commit)."""
    found = await kafka.committed_metadata(group, tp)
    if found is None:
        return None
    return decode(found[1], tp.topic, tp.partition, found[0])


class Life:
    """One life of the roster: each member acks the records below its limit and hangs
    on the one at it, until :meth:`end`. ``deliveries`` fills as records come."""

    def __init__(self, kafka: KafkaTestCluster, topic: str, group: str) -> None:
        self.kafka, self.topic, self.group = kafka, topic, group
        self.deliveries: dict[str, Counter[int]] = {sid: Counter() for sid in ROSTER}
        self.manager = SharedStreamManager()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, limits: dict[str, int]) -> None:
        self.tasks = [asyncio.create_task(self._member(sid, limits[sid])) for sid in ROSTER]

    def _make(self) -> KafkaStreamProducer:
        return KafkaStreamProducer(
            self.topic, bootstrap_servers=self.kafka.bootstrap, group_id=self.group
        )

    async def _member(self, sid: str, limit: int) -> None:
        async with self.manager.subscribe(
            self.topic, sid, producer=self._make, roster=ROSTER
        ) as sub:
            async for record in sub:
                n = int(record.value)
                self.deliveries[sid][n] += 1
                if n >= limit:
                    await asyncio.Event().wait()  # hangs until the life ends

    async def end(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.manager.aclose()


async def test_a_new_owner_hands_each_member_only_what_it_had_not_finished(
    kafka: KafkaTestCluster,
) -> None:
    topic, group = kafka.unique("progress"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, COUNT, 1)
    tp = TopicPartition(topic, 0)

    first = Life(kafka, topic, group)
    first.start(LIMITS)
    try:
        async with asyncio.timeout(30):
            # The broker offers nothing to await: poll the committed map until it holds
            # what each member acked past the commit.
            while True:
                found = await committed_map(kafka, group, tp)
                if isinstance(found, OffsetMap) and dict(found.members) == {
                    "fast": [(0, COUNT)],
                    "mid": [(0, 70)],
                    "slow": [(0, 40)],
                }:
                    break
                await asyncio.sleep(0.1)
    finally:
        await first.end()
    # While they hang, nothing of the fetch (one run) is advanced; ending the life fails
    # what ``slow`` held, so the commit is held at its first unfinished offset.
    assert (await kafka.committed(group))[tp] == 40
    assert first.deliveries["fast"] == Counter(range(COUNT))
    assert first.deliveries["mid"] == Counter(range(71))
    assert first.deliveries["slow"] == Counter(range(41))

    second = Life(kafka, topic, group)
    second.start(dict.fromkeys(ROSTER, COUNT))
    try:
        async with asyncio.timeout(30):
            await kafka.wait_committed_to_end(group, topic, 1)
        (stats,) = second.manager.stats()
    finally:
        await second.end()
    assert second.deliveries["fast"] == Counter()
    assert second.deliveries["mid"] == Counter(range(70, COUNT))
    assert second.deliveries["slow"] == Counter(range(40, COUNT))
    assert stats.redeliveries_skipped == (COUNT - 40) + (70 - 40)
    assert stats.progress_overflows == 0
