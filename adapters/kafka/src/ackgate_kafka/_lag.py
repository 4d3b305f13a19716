"""The consumer group's lag per partition, measured every :data:`LAG_INTERVAL` seconds.

Per partition of the subscribed topics, assigned to this consumer or not (so a
partition whose consumer died still shows until it is reassigned): the end offset
(``end_offsets``: one ListOffsets request per leader) minus the group's committed
offset (one OffsetFetch request to the coordinator); a partition with no commit
counts from its first offset. Two or three requests per interval, whatever the
number of messages. A measurement that fails or takes longer than
:data:`MEASURE_TIMEOUT` (the broker is away) keeps the last one; the outage watch
reports the outage. Read through ``KafkaStreamProducer.broker_lag()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ackgate import BrokerLag

log = logging.getLogger("ackgate.adapters.kafka")

#: Seconds between two measurements.
LAG_INTERVAL = 5.0
#: Seconds one measurement may take before it is given up (the broker is slow or away).
MEASURE_TIMEOUT = 5.0


class LagWatch:
    """Measures the lag of ``consumer``'s group on ``topics``; :attr:`last` is the latest.

    Caller: the fetcher (``start()`` once the consumer joined, ``close()`` when the
    stream ends).
    """

    def __init__(self, consumer: Any, topics: list[str], group: str) -> None:
        self._consumer = consumer
        self._topics = topics
        self._group = group
        #: The latest measurement; ``None`` until the first one.
        self.last: BrokerLag | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ackgate-kafka-lag")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(MEASURE_TIMEOUT):
                    self.last = await self.measure()
            except TimeoutError:
                pass  # the broker is slow or away: keep the last measurement
            except Exception as exc:  # a lag measurement must never end the group
                log.debug("Kafka lag measurement failed group=%s: %r", self._group, exc)
            await asyncio.sleep(LAG_INTERVAL)

    async def measure(self) -> BrokerLag:
        """One measurement (cancelled with the watch)."""
        from aiokafka.structs import TopicPartition

        consumer = self._consumer
        partitions = [
            TopicPartition(topic, partition)
            for topic in self._topics
            for partition in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            return BrokerLag(measured_at=time.time())
        ends = await consumer.end_offsets(partitions)
        # aiokafka's public ``committed()`` asks one partition at a time; this is what
        # it calls, for all of them at once.
        committed = await consumer._coordinator.fetch_committed_offsets(partitions)
        starts: dict[Any, int] = {}
        uncommitted = [tp for tp in partitions if _offset(committed.get(tp)) is None]
        if uncommitted:
            starts = await consumer.beginning_offsets(uncommitted)
        lanes = {}
        for tp in partitions:
            done = _offset(committed.get(tp))
            start = starts.get(tp, 0) if done is None else done
            lanes[tp] = max(0, ends[tp] - start)
        return BrokerLag(lanes=lanes, measured_at=time.time())


def _offset(found: Any) -> int | None:
    return found.offset if found is not None and found.offset >= 0 else None
