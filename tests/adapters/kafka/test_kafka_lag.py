"""docs/production.md#lag-and-the-oldest-message on genuine Kafka: while a handler is blocked on
one message, the lag per partition (end offset minus committed offset), how far each handler is
behind, and the oldest message named (lane, id, the handler holding it) are exact, in
``service.stats()`` and in ``/readyz``'s JSON (which stays 200); the partition of a consumer
SIGKILLed shows its lag until the session timeout gives it to the survivor. A used offset map
is logged. New partitions are looked for every 30 s by default."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

import ackgate_kafka._lag
from ackgate import Message, Service
from ackgate._operating.health import HealthServer, loop_probes
from ackgate_kafka import KafkaStreamProducer
from ackgate_kafka._offset_map import OffsetRuns, encode

from .kafka_testlib import KafkaTestCluster

PARTITIONS = 2
COUNT = 10  # values 0..9, n on partition n % 2: partition 0 holds 0, 2, 4, 6, 8


async def until(check: Callable[[], Any], what: str, limit: float = 20.0) -> Any:
    """Poll ``check`` (statistics offer nothing to await), bounded."""
    async with asyncio.timeout(limit):
        while True:
            if found := check():
                return found
            await asyncio.sleep(0.05)


async def test_lag_and_the_oldest_message_are_exact_while_a_handler_is_blocked(
    kafka: KafkaTestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ackgate_kafka._lag, "LAG_INTERVAL", 0.2)
    topic, group = kafka.unique("lag"), kafka.unique("g")
    await kafka.create_topic(topic, PARTITIONS)
    await kafka.produce(topic, COUNT, PARTITIONS)
    service = Service(
        "lagged",
        producer=lambda: KafkaStreamProducer(
            topic, bootstrap_servers=kafka.bootstrap, group_id=group
        ),
    )
    release = asyncio.Event()
    fast_done: list[int] = []

    @service.handler("fast")
    async def fast(message: Message) -> None:
        fast_done.append(int(message.body))

    @service.handler("slow", ordering="lane", concurrency=2)
    async def slow(message: Message) -> None:
        if message.body == b"2":  # partition 0, offset 1
            await release.wait()

    running = asyncio.create_task(service.run())
    server = None
    try:
        # Each partition's fetch is one batch, advanced as one: partition 0 stays
        # committed at 0 while "slow" holds offset 1; partition 1 is committed to its end.
        expected_lanes = {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 0}

        def settled() -> Any:
            stats = service.stats()
            group_stats = stats.group
            if group_stats is None or group_stats.broker_lag is None or len(fast_done) < COUNT:
                return None
            return stats if dict(group_stats.broker_lag.lanes) == expected_lanes else None

        stats = await until(settled, "the lag of a partition held at offset 1")
        assert stats.group.broker_lag.total == 5
        oldest = stats.oldest
        assert oldest is not None
        assert (oldest.lane, oldest.id, oldest.handlers, oldest.key) == (
            TopicPartition(topic, 0),
            f"{topic}/0/0",
            ("slow",),
            None,
        )
        # "slow" has not finished its part of partition 0's batch; "fast" finished all.
        assert {h.id: h.behind for h in stats.handlers.values()} == {"fast": 0, "slow": 5}

        server = HealthServer("127.0.0.1", 0, loop_probes(asyncio.get_running_loop(), [service]))
        url = f"http://127.0.0.1:{server.port}/readyz"
        reply = await asyncio.to_thread(urllib.request.urlopen, url, timeout=5)
        body = json.loads(reply.read())
        assert reply.status == 200  # an old message does not make the service unready
        (named,) = body["oldest"]
        assert (named["id"], named["handlers"], named["lane"]) == (
            f"{topic}/0/0",
            ["slow"],
            repr(TopicPartition(topic, 0)),
        )
        assert named["age"] > 0

        release.set()
        await until(
            lambda: (
                (g := service.stats().group) is not None
                and g.broker_lag is not None
                and g.broker_lag.total == 0
                and g.oldest is None
            ),
            "no lag once released",
        )
    finally:
        if server is not None:
            server.close()
        release.set()
        await service.stop(5)
        await running


async def test_a_used_offset_map_is_logged_with_the_offsets_it_skips(
    kafka: KafkaTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = kafka.unique("map"), kafka.unique("g")
    await kafka.create_topic(topic, 1)
    await kafka.produce(topic, 5, 1)
    # Another client commits a well-formed map for this topic, partition and offset:
    # offsets 1 and 2 finished past the committed offset 0.
    tp = TopicPartition(topic, 0)
    committer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group)
    await committer.start()
    try:
        committer.assign([tp])
        metadata, complete = encode(topic, 0, 0, OffsetRuns(iter([(1, 3)])), 3, {})
        assert complete
        await committer.commit({tp: (0, metadata)})
    finally:
        await committer.stop()
    seen: list[bytes] = []
    service = Service(
        "mapped",
        producer=lambda: KafkaStreamProducer(
            topic, bootstrap_servers=kafka.bootstrap, group_id=group
        ),
    )

    @service.handler("only")
    async def only(message: Message) -> None:
        seen.append(message.body)

    caplog.set_level(logging.INFO, logger="ackgate.adapters.kafka")
    running = asyncio.create_task(service.run())
    try:
        await until(lambda: len(seen) >= 3, "the offsets the map does not list")
    finally:
        await service.stop(5)
        await running
    assert seen == [b"0", b"3", b"4"]
    used = [r.getMessage() for r in caplog.records if "Using the offset map" in r.getMessage()]
    assert used == [
        f"Using the offset map committed with {topic}-0@0: 2 offset(s) past it finished "
        "(skipped when fetched again), 0 with delivery counts"
    ]


def test_new_partitions_are_looked_for_every_20_seconds_unless_told_otherwise() -> None:
    made = KafkaStreamProducer("t", bootstrap_servers="127.0.0.1:1", group_id="g")
    assert made._options["metadata_max_age_ms"] == 20_000
    given = KafkaStreamProducer(
        "t", bootstrap_servers="127.0.0.1:1", group_id="g", metadata_max_age_ms=5_000
    )
    assert given._options["metadata_max_age_ms"] == 5_000


# A consumer of the group that commits nothing; SIGKILLed, it leaves its partition
# unconsumed until the coordinator's session timeout (6 s) gives it to the survivor.
DEAD_CONSUMER = """
import asyncio, sys
from aiokafka import AIOKafkaConsumer

async def main():
    consumer = AIOKafkaConsumer(
        sys.argv[1], bootstrap_servers=sys.argv[2], group_id=sys.argv[3],
        enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500,
    )
    await consumer.start()
    said = None
    while True:
        await consumer.getmany(timeout_ms=200)
        owned = sorted(tp.partition for tp in consumer.assignment())
        if owned != said:
            print("assigned", *owned, flush=True)
            said = owned

asyncio.run(main())
"""


async def test_the_partition_of_a_killed_consumer_shows_its_lag_until_reassigned(
    kafka: KafkaTestCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ackgate_kafka._lag, "LAG_INTERVAL", 0.2)
    topic, group = kafka.unique("killed"), kafka.unique("g")
    await kafka.create_topic(topic, PARTITIONS)
    (tmp_path / "dead_consumer.py").write_text(DEAD_CONSUMER)
    other = await asyncio.create_subprocess_exec(
        sys.executable,
        str(tmp_path / "dead_consumer.py"),
        topic,
        kafka.bootstrap,
        group,
        stdout=asyncio.subprocess.PIPE,
    )
    assert other.stdout is not None

    async def assigned(count: int) -> list[bytes]:
        async with asyncio.timeout(30):
            while True:
                words = (await other.stdout.readline()).split()  # type: ignore[union-attr]
                assert words, "the other consumer ended"
                if len(words) == count + 1:
                    return words[1:]

    seen: list[bytes] = []
    service = Service(
        "survivor",
        producer=lambda: KafkaStreamProducer(
            topic, bootstrap_servers=kafka.bootstrap, group_id=group
        ),
    )

    @service.handler("only")
    async def only(message: Message) -> None:
        seen.append(message.body)

    running = None
    try:
        await assigned(PARTITIONS)
        running = asyncio.create_task(service.run())
        (dead_partition,) = await assigned(1)  # the rebalance gave the survivor the other
        await kafka.produce(topic, COUNT, PARTITIONS)  # 5 per partition
        other.kill()
        await other.wait()
        dead = TopicPartition(topic, int(dead_partition))
        own = TopicPartition(topic, 1 - int(dead_partition))
        lanes = {own: 0, dead: 5}  # nothing of the dead one's partition is committed
        await until(
            lambda: (
                (g := service.stats().group) is not None
                and g.broker_lag is not None
                and dict(g.broker_lag.lanes) == lanes
                and len(seen) == 5
            ),
            "the dead consumer's partition lagging, the survivor's not",
        )
        await until(
            lambda: (
                (g := service.stats().group) is not None
                and g.broker_lag is not None
                and g.broker_lag.total == 0
                and len(seen) == COUNT
            ),
            "its partition reassigned and read",
            limit=40,
        )
    finally:
        if other.returncode is None:
            other.kill()
            await other.wait()
        if running is not None:
            await service.stop(5)
            await running
