"""How soon partitions added to a topic are read and committed, with the adapter's defaults.

    python benchmarks/kafka_new_partitions.py [--bootstrap HOST:PORT] [--metadata-max-age-ms N]

Without ``--bootstrap`` (or ``ACKGATE_KAFKA_BOOTSTRAP``) it starts a broker the way the
tests do. A one-handler ``Service`` consumes a topic of 1 partition; once it committed
that partition, 2 partitions are added and one message written to each new one. Prints
the seconds from the partitions' creation to their messages being committed, next to
the bound the metadata refresh sets (``metadata_max_age_ms``: the adapter's default,
30 s, unless given; aiokafka's own default is 300 s). Not part of the test run: the
wait is up to the refresh interval (the test suite checks the default value instead,
``tests/adapters/kafka/test_kafka_lag.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from ackgate import Message, Service
from ackgate_kafka import KafkaStreamProducer
from ackgate_kafka._producer import DEFAULT_METADATA_MAX_AGE_MS

AIOKAFKA_DEFAULT_MS = 300_000


async def committed(admin: AIOKafkaAdminClient, group: str) -> dict[TopicPartition, int]:
    offsets = await admin.list_consumer_group_offsets(group)
    return {tp: meta.offset for tp, meta in offsets.items()}


async def until_committed(
    admin: AIOKafkaAdminClient, group: str, wanted: dict[TopicPartition, int]
) -> None:
    """Poll the group's commits (the broker offers nothing to await)."""
    while True:
        try:
            found = await committed(admin, group)
        except KafkaError as exc:  # a fresh group: "coordinator not available" for a while
            if not exc.retriable:
                raise
            found = {}
        if all(found.get(tp) == offset for tp, offset in wanted.items()):
            return
        await asyncio.sleep(0.2)


async def run(bootstrap: str, max_age_ms: int | None, limit: float) -> float:
    topic, group = f"grow-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    writer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await writer.start()
    options = {} if max_age_ms is None else {"metadata_max_age_ms": max_age_ms}
    service = Service(
        "growing",
        producer=lambda: KafkaStreamProducer(
            topic, bootstrap_servers=bootstrap, group_id=group, **options
        ),
    )

    @service.handler("only")
    async def only(message: Message) -> None:
        pass

    running = None
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
        await writer.send_and_wait(topic, b"first", partition=0)
        running = asyncio.create_task(service.run())
        async with asyncio.timeout(60):
            await until_committed(admin, group, {TopicPartition(topic, 0): 1})
        await admin.create_partitions({topic: NewPartitions(total_count=3)})
        grown = time.monotonic()
        # The writer's own metadata learns the new partitions before it may write there.
        await writer.client.force_metadata_update()
        for partition in (1, 2):
            await writer.send_and_wait(topic, b"new", partition=partition)
        async with asyncio.timeout(limit):
            await until_committed(
                admin, group, {TopicPartition(topic, 1): 1, TopicPartition(topic, 2): 1}
            )
        return time.monotonic() - grown
    finally:
        if running is not None:
            await service.stop(5)
            await running
        await writer.stop()
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("ACKGATE_KAFKA_BOOTSTRAP"))
    parser.add_argument("--metadata-max-age-ms", type=int, default=None)
    args = parser.parse_args()
    bound = (args.metadata_max_age_ms or DEFAULT_METADATA_MAX_AGE_MS) / 1000
    limit = bound + 60  # the refresh, then a rebalance
    if args.bootstrap:
        seconds = asyncio.run(run(args.bootstrap, args.metadata_max_age_ms, limit))
    else:
        from ackgate.testing.brokers import broker

        with broker("kafka") as kafka:
            seconds = asyncio.run(run(kafka.bootstrap, args.metadata_max_age_ms, limit))
    print(
        f"new partitions committed {seconds:.1f} s after they were added "
        f"(metadata_max_age_ms {bound * 1000:.0f}: bound {bound:.0f} s; "
        f"{seconds / (AIOKAFKA_DEFAULT_MS / 1000):.2f} of aiokafka's default 300 s)"
    )


if __name__ == "__main__":
    main()
