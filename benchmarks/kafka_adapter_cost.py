"""The Kafka adapter's own cost per record, without a broker or the core.

    python benchmarks/kafka_adapter_cost.py [--records 200000] [--repeat 5]

A stand-in for ``aiokafka.AIOKafkaConsumer`` hands out fetches built before the clock
starts (4 partitions x 500 records of 100 B, offsets without gaps), so what is timed
is the adapter alone:

* **fetch**: ``open_stream_batches`` cutting each fetch into ``EventBatch`` es (the
  deliveries, the ids);
* **advance**: advancing every batch clean as the group would: ``advance_runs`` with
  one clean run when the producer overrides it, else ``advance`` with one item per
  record (the items are built before the clock starts; commits go to the stand-in).

Prints microseconds per record, the median and the best of ``--repeat`` runs. Not
part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any, ClassVar

import aiokafka
from aiokafka.structs import ConsumerRecord, TopicPartition

from ackgate import AdvanceItem, AdvanceOutcome, AdvanceRun
from ackgate._contract.producer import overrides
from ackgate_kafka import KafkaStreamProducer

PARTITIONS, PER_FETCH = 4, 500
CLEAN = AdvanceOutcome(acked=4, failed=0, rejected=0)


class _Coordinator:
    coordinator_id = 1

    async def fetch_committed_offsets(self, partitions: Any) -> dict[Any, Any]:
        return {}  # a new group: nothing committed, no offset map


class _Consumer:
    """Just what the adapter calls; ``getmany`` pops a prebuilt fetch."""

    fetches: ClassVar[list[dict[Any, list[Any]]]] = []

    def __init__(self, **options: Any) -> None:
        self._coordinator = _Coordinator()

    def subscribe(self, topics: Any, listener: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def commit(self, offsets: Any) -> None:
        pass

    def assignment(self) -> set[Any]:
        return {TopicPartition("t", p) for p in range(PARTITIONS)}

    def pause(self, *partitions: Any) -> None:
        pass

    def resume(self, *partitions: Any) -> None:
        pass

    def seek(self, partition: Any, offset: int) -> None:
        pass

    async def getmany(self, timeout_ms: int = 0) -> dict[Any, list[Any]]:
        return self.fetches.pop()


def prebuilt(records: int) -> list[dict[Any, list[Any]]]:
    fetches = []
    for start in range(0, records // PARTITIONS + 2 * PER_FETCH, PER_FETCH):
        fetches.append(
            {
                TopicPartition("t", p): [
                    ConsumerRecord("t", p, start + i, 0, 0, None, b"x" * 100, None, 0, 100, ())
                    for i in range(PER_FETCH)
                ]
                for p in range(PARTITIONS)
            }
        )
    fetches.reverse()
    return fetches


async def once(records: int) -> tuple[float, float]:
    """Seconds per record spent fetching and advancing ``records`` records."""
    _Consumer.fetches = prebuilt(records)
    producer = KafkaStreamProducer("t", bootstrap_servers="stand-in:9092", group_id="g")
    bulk = overrides(producer, "advance_runs")
    batches = producer.open_stream_batches()
    fetching = advancing = 0.0
    seen = 0
    try:
        while seen < records:
            started = time.perf_counter()
            batch = await anext(batches)
            fetching += time.perf_counter() - started
            seen += len(batch.raw_events)
            if bulk:
                runs = [AdvanceRun(batch.broker_payloads, CLEAN)]
                started = time.perf_counter()
                await producer.advance_runs(runs)
            else:
                items = [AdvanceItem(payload, CLEAN) for payload in batch.broker_payloads]
                started = time.perf_counter()
                await producer.advance(items)
            advancing += time.perf_counter() - started
    finally:
        await batches.aclose()
        await producer.aclose()
    return fetching / seen, advancing / seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    aiokafka.AIOKafkaConsumer = _Consumer  # the adapter imports aiokafka lazily
    results = [asyncio.run(once(args.records)) for _ in range(args.repeat)]
    for name, values in zip(("fetch", "advance"), zip(*results, strict=True), strict=True):
        print(
            f"{name:<8} {statistics.median(values) * 1e6:6.3f} us/record median, "
            f"{min(values) * 1e6:6.3f} best of {args.repeat}"
        )


if __name__ == "__main__":
    main()
