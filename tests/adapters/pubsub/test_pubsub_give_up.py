"""docs/failure-semantics.md#poison-messages on Pub/Sub: ``Message.attempt`` counts up across
redeliveries (Pub/Sub's ``delivery_attempt`` under a dead-letter policy, the producer's own count
without one), and a message that always fails is published to ``dlq_topic`` after ``give_up_after``
attempts, with the reason, and nothing else is lost."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

import pytest

from ackgate import Message, Redelivery, Service
from ackgate_pubsub import PubSubStreamProducer

from .pubsub_support import PubSubAdmin, text


@pytest.mark.parametrize("dead_letter_policy", [False, True])
async def test_a_message_that_always_fails_is_dead_lettered_after_give_up_after_attempts(
    pubsub: PubSubAdmin, dead_letter_policy: bool
) -> None:
    topic, dlq_topic = await pubsub.create_topic(), await pubsub.create_topic()
    dlq = await pubsub.create_subscription(dlq_topic)
    # The subscription's own policy (5 attempts at least) would move it later than 3.
    policy_topic = await pubsub.create_topic() if dead_letter_policy else None
    subscription = await pubsub.create_subscription(topic, dead_letter_topic=policy_topic)
    bodies = ["poison", *(f"ok-{n}" for n in range(5))]
    await pubsub.publish(topic, bodies)
    service = Service(
        "pubsub",
        producer=lambda: PubSubStreamProducer(subscription, dlq_topic=dlq_topic, pull_timeout=2),
        redelivery=Redelivery(backoff=0.2, max_backoff=0.4),
    )
    attempts: list[int | None] = []
    # Each hand-out's broker delivery and loop time: the same delivery, after a backoff.
    raws: list[Any] = []
    times: list[float] = []
    handled: dict[str, Counter[str]] = {"picky": Counter(), "other": Counter()}
    done = asyncio.Event()

    def finished() -> None:
        if attempts[-1:] == [3] and all(len(seen) == 5 for seen in handled.values()):
            done.set()

    @service.handler("picky", give_up_after=3)
    async def picky(message: Message) -> None:
        if message.body == b"poison":
            attempts.append(message.attempt)
            raws.append(message.raw)
            times.append(asyncio.get_running_loop().time())
            finished()
            raise ValueError("bad row")
        handled["picky"][message.body.decode()] += 1
        finished()

    @service.handler("other")
    async def other(message: Message) -> None:
        if message.body != b"poison":
            handled["other"][message.body.decode()] += 1
        finished()

    async with asyncio.timeout(60):
        running = asyncio.create_task(service.run())
        await done.wait()
        await service.stop()  # the last call has returned: its reject is advanced
        await running
    assert attempts == [1, 2, 3]
    # Handed again in-process (the broker never redelivered it), after each backoff's
    # lower bound (half its ceiling): 0.1 s, then 0.2 s.
    assert all(raw is raws[0] for raw in raws)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19, gaps
    assert handled["picky"] == handled["other"] == Counter(bodies[1:])  # nothing else lost
    assert service.stats().handlers["picky"].gave_up == 1
    (letter,) = await pubsub.pull(dlq, wait=10)
    assert text(letter) == "poison"
    assert letter.message.attributes["ackgate-reason"] == (
        "rejected by 1 of 2 subscribers; picky: gave up after 3 attempts: ValueError: bad row"
    )
    assert await pubsub.pull(subscription, wait=3) == []


def test_the_dead_letter_destination_is_dlq_topic_only() -> None:
    # Without it a reject is nacked to the subscription's dead-letter policy, if any:
    # give_up_after is then refused (the service would not know where it went).
    subscription, dlq = "projects/p/subscriptions/s", "projects/p/topics/dlq"
    assert PubSubStreamProducer(subscription).dead_letter_destination() is None
    assert PubSubStreamProducer(subscription, dlq_topic=dlq).dead_letter_destination() == (
        f"Pub/Sub topic {dlq}"
    )
