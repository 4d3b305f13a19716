"""docs/dead-letters.md on the Pub/Sub emulator: ``ackgate dlq list`` reads a subscription on
the dead-letter topic grouped by handler and reason (and lets the messages go again),
``replay --to-handler --service`` publishes them to the source subscription's topic for that
handler of that service only and acks them on the DLQ subscription; the other handler acks
them unseen; rejected again, a copy is in the DLQ once, as a replay."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from ackgate import Message, Reject, Service
from ackgate._operating.cli import main
from ackgate_pubsub import PubSubStreamProducer

from .pubsub_support import PubSubAdmin


async def serve(subscription: str, dlq_topic: str, broken: set[bytes], expect: int) -> Counter[str]:
    """A store and a checker (it rejects ``broken`` bodies) until ``expect`` calls of the
    checker; the calls per handler and body."""
    calls: Counter[str] = Counter()
    checked = asyncio.Event()
    service = Service(
        "shop",
        producer=lambda: PubSubStreamProducer(subscription, dlq_topic=dlq_topic, pull_timeout=2),
    )

    @service.handler("store")
    async def store(message: Message) -> None:
        calls["store"] += 1

    @service.handler("checker")
    async def checker(message: Message) -> None:
        calls["checker"] += 1
        calls[message.body.decode()] += 1
        if calls["checker"] == expect:
            checked.set()
        if message.body in broken:
            raise Reject("no such customer")

    async with asyncio.timeout(60):
        task = asyncio.create_task(service.run())
        await checked.wait()
        await service.stop()
        await task
    return calls


async def dlq(capsys: pytest.CaptureFixture[str], *args: str, subscription: str) -> str:
    status = await asyncio.to_thread(main, ["dlq", args[0], "pubsub", subscription, *args[1:]])
    assert status == 0
    return capsys.readouterr().out


async def test_dead_letters_listed_and_replayed_to_one_handler_on_pubsub(
    pubsub: PubSubAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, dlq_topic = await pubsub.create_topic(), await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    dead = await pubsub.create_subscription(dlq_topic)
    await pubsub.publish(topic, ["a", "b", "c"])
    first = await serve(subscription, dlq_topic, {b"b", b"c"}, expect=3)
    assert (first["store"], first["checker"]) == (3, 3)

    listed = json.loads(await dlq(capsys, "list", "--json", subscription=dead))
    assert listed["total"] == 2
    (row,) = listed["groups"]
    assert (row["handler"], row["reason"], row["count"]) == ("checker", "no such customer", 2)
    again = json.loads(await dlq(capsys, "list", "--json", subscription=dead))
    assert again["total"] == 2  # listing let them go again

    out = await dlq(
        capsys,
        "replay",
        "--all",
        "--to-handler",
        "checker",
        "--service",
        "shop",
        subscription=dead,
    )
    assert "replayed 2 of 2 dead letters to handler 'checker' only of service 'shop'" in out
    second = await serve(subscription, dlq_topic, {b"c"}, expect=2)
    assert second["store"] == 0 and (second["b"], second["c"]) == (1, 1)

    listed = json.loads(await dlq(capsys, "list", "--json", subscription=dead))
    assert (listed["total"], listed["replays"]) == (1, 1)  # c, once, as a replay
