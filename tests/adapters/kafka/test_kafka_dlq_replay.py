"""docs/dead-letters.md on genuine Kafka, in one test: a service's notifier gives up on
some messages; ``ackgate dlq list`` lists them under the notifier; they are replayed to
the notifier only; the store and the batch audit are not called again (counts per
handler); the one that fails again is in the DLQ once, as a replay, and is not picked by
the next replay."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from ackgate import Message, Service
from ackgate._operating.cli import main
from ackgate_kafka import KafkaStreamProducer

from .kafka_testlib import KafkaTestCluster

POISON = {b"order-3", b"order-5", b"order-8"}


async def serve_until_committed(
    kafka: KafkaTestCluster, topic: str, group: str, dlq: str, broken: set[bytes]
) -> Counter[str]:
    """Run a store, a batch audit and a notifier (it fails ``broken`` bodies, giving up
    after 2 attempts) until the group committed the topic's end; the calls per handler."""
    calls: Counter[str] = Counter()
    service = Service(
        "orders",
        producer=lambda: KafkaStreamProducer(
            [topic], bootstrap_servers=kafka.bootstrap, group_id=group, dlq_topic=dlq
        ),
    )

    @service.handler("store")
    async def store(message: Message) -> None:
        calls["store"] += 1

    @service.handler("audit", batch_size=20, batch_wait=0.05)
    async def audit(messages: list[Message]) -> None:
        calls["audit"] += len(messages)

    @service.handler("notifier", give_up_after=2)
    async def notifier(message: Message) -> None:
        calls["notifier"] += 1
        calls[message.body.decode()] += 1
        if message.body in broken:
            raise ConnectionError("mail server down")

    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(60):
            await kafka.wait_committed_to_end(group, topic, 1)
    finally:
        await service.stop(10)
        await task
    return calls


def dlq(*args: str, bootstrap: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(
        ["dlq", *args[:1], "kafka", *args[1:2], "-o", f"bootstrap_servers={bootstrap}", *args[2:]]
    )
    return status, capsys.readouterr().out


def test_dead_letters_listed_and_replayed_to_the_one_handler_that_gave_up(
    kafka: KafkaTestCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group, dead = kafka.unique("orders"), kafka.unique("g"), kafka.unique("dlq")

    async def setup() -> None:
        await kafka.create_topic(topic, 1)
        await kafka.create_topic(dead, 1)
        await kafka.produce_bodies(topic, [b"order-%d" % n for n in range(10)])

    asyncio.run(setup())
    first = asyncio.run(serve_until_committed(kafka, topic, group, dead, POISON))
    assert (first["store"], first["audit"]) == (10, 10)
    assert all(first[f"order-{n}"] == 2 for n in (3, 5, 8))  # given up at attempt 2

    status, out = dlq("list", dead, "--json", bootstrap=kafka.bootstrap, capsys=capsys)
    assert status == 0
    listed = json.loads(out)
    assert listed["total"] == 3 and listed["replays"] == 0
    (group_row,) = listed["groups"]
    assert group_row["handler"] == "notifier" and group_row["count"] == 3
    assert group_row["reason"].startswith("gave up after 2 attempts: ConnectionError")

    one = group_row["ids"][0]
    status, out = dlq("show", dead, one, bootstrap=kafka.bootstrap, capsys=capsys)
    assert status == 0
    assert f"id:          {one}" in out and f"source:      {topic}" in out
    assert "reason:      rejected by 1 of 3 subscribers: notifier: gave up" in out
    assert "body:        b'order-3'" in out

    status, out = dlq(
        "replay",
        dead,
        "--handler",
        "notifier",
        "--to-handler",
        "notifier",
        "--dry-run",
        bootstrap=kafka.bootstrap,
        capsys=capsys,
    )
    assert status == 0 and "3 of 3 dead letters would be replayed" in out
    status, out = dlq(
        "replay",
        dead,
        "--handler",
        "notifier",
        "--to-handler",
        "notifier",
        "--service",
        "orders",
        bootstrap=kafka.bootstrap,
        capsys=capsys,
    )
    assert status == 0
    assert "replayed 3 of 3 dead letters to handler 'notifier' only of service 'orders'" in out

    # The mail server is back, except for order-8.
    second = asyncio.run(serve_until_committed(kafka, topic, group, dead, {b"order-8"}))
    assert (second["store"], second["audit"]) == (0, 0)  # acked unseen
    assert (second["order-3"], second["order-5"], second["order-8"]) == (1, 1, 2)
    assert second["notifier"] == 4

    status, out = dlq("list", dead, "--json", bootstrap=kafka.bootstrap, capsys=capsys)
    listed = json.loads(out)
    assert listed["total"] == 4 and listed["replays"] == 1  # order-8 once more, once
    status, out = dlq(
        "replay",
        dead,
        "--reason",
        "mail server",
        "--id",
        "x-none",
        "--dry-run",
        bootstrap=kafka.bootstrap,
        capsys=capsys,
    )
    assert "0 of 4" in out and "1 replays already left alone" in out
    replayed: list[Any] = [g for g in listed["groups"] if g["handler"] == "notifier"]
    assert sum(g["count"] for g in replayed) == 4
