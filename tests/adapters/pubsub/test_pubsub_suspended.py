"""docs/writing-an-adapter.md#1-the-producer, docs/production.md#service-options and
docs/concepts.md#redelivery-memory against the Pub/Sub emulator: a suspended producer keeps its
leases, a redelivered copy goes only to the handler that failed it, and ``to_message`` fills every
field the Pub/Sub way."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from ackgate import GroupStats, Message, SharedStreamManager, Subscription
from ackgate_pubsub import PubSubStreamProducer

from .pubsub_support import PubSubAdmin, text

ACK_DEADLINE = 10  # the emulator's minimum, and the subscription's
SUSPENSION = 25.0  # two and a half ack deadlines


async def test_a_group_suspended_for_two_and_a_half_ack_deadlines_gets_nothing_back(
    pubsub: PubSubAdmin,
) -> None:
    # overflow="block" and a queue of one: while "stalled" does not pull, the poll
    # waits in a broadcast and open_stream sits at a yield, most of its pull not
    # yielded yet. Another puller of the subscription must get nothing meanwhile.
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    bodies = [f"m{i}" for i in range(10)]
    await pubsub.publish(topic, bodies)
    producer = PubSubStreamProducer(subscription, ack_deadline=ACK_DEADLINE, max_messages=10)
    seen: dict[str, Counter[str]] = {"fast": Counter(), "stalled": Counter()}
    ids: dict[str, set[str]] = {"fast": set(), "stalled": set()}
    stolen: list[Any] = []
    received = asyncio.Event()

    async def read(sub: Subscription, name: str, *, stall: bool) -> None:
        async with sub:
            if stall:
                await received.wait()
                loop = asyncio.get_running_loop()
                until = loop.time() + SUSPENSION
                while loop.time() < until:
                    stolen.extend(await pubsub.pull(subscription, wait=5))
            async for raw in sub:
                seen[name][text(raw)] += 1
                ids[name].add(raw.message.message_id)
                received.set()
                if len(seen[name]) == len(bodies):
                    return

    async with (
        asyncio.timeout(60),
        SharedStreamManager(overflow="block", subscriber_queue_size=1, ack_timeout=120) as manager,
    ):
        fast = manager.subscribe("held", "fast", producer=lambda: producer)
        stalled = manager.subscribe("held", "stalled", producer=lambda: producer)
        await asyncio.gather(read(fast, "fast", stall=False), read(stalled, "stalled", stall=True))
    assert stolen == []
    assert all(counter == Counter(bodies) for counter in seen.values())  # handed out once
    assert len(ids["fast"]) == len(bodies) and ids["fast"] == ids["stalled"]
    # Longer than the 10 s deadline: anything not acknowledged would be back.
    assert await pubsub.pull(subscription, wait=12) == []


async def test_a_redelivered_copy_goes_only_to_the_handler_that_failed_it(
    pubsub: PubSubAdmin,
) -> None:
    # Issue 14. Three declared handlers; "flaky" crashes on the second message it
    # gets while the others ack it: the adapter nacks it, Pub/Sub redelivers it, and
    # the copy (same message_id) is handed to "flaky" alone. Everyone reads until
    # "end", published once "flaky" had its copy.
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    await pubsub.publish(topic, ["m0", "m1", "m2"])
    producer = PubSubStreamProducer(subscription, ack_deadline=60, max_messages=1)
    roster = {"indexer", "auditor", "flaky"}
    seen: dict[str, list[str]] = {name: [] for name in roster}
    stats: list[GroupStats] = []

    def make() -> PubSubStreamProducer:
        return producer

    async def read(sub: Subscription, name: str) -> None:
        async with sub:
            async for raw in sub:
                body = text(raw)
                seen[name].append(body)
                if body == "end":
                    return
                if name != "flaky" or len(seen[name]) < 2:
                    continue
                if len(seen[name]) == 2:
                    raise RuntimeError("flaky handler crashed")
                if seen[name].count(seen[name][1]) == 2 and len(set(seen[name])) == 3:
                    stats.extend(manager.stats())  # every copy was broadcast by now
                    await pubsub.publish(topic, ["end"])

    async def flaky() -> Subscription:
        with pytest.raises(RuntimeError):
            await read(manager.subscribe("svc", "flaky", producer=make, roster=roster), "flaky")
        again = manager.subscribe("svc", "flaky", producer=make, roster=roster)
        await read(again, "flaky")
        return again

    async with asyncio.timeout(60), SharedStreamManager(ack_timeout=60) as manager:
        subs = {
            name: manager.subscribe("svc", name, producer=make, roster=roster)
            for name in ("indexer", "auditor")
        }
        *_, again = await asyncio.gather(
            read(subs["indexer"], "indexer"), read(subs["auditor"], "auditor"), flaky()
        )
    for name in ("indexer", "auditor"):
        assert sorted(seen[name][:3]) == ["m0", "m1", "m2"] and seen[name][3:] == ["end"]
    assert seen["flaky"].count(seen["flaky"][1]) == 2
    [group] = stats
    assert group.redeliveries_skipped >= 2
    assert subs["indexer"].redeliveries_skipped == subs["auditor"].redeliveries_skipped
    assert subs["indexer"].redeliveries_skipped * 2 == group.redeliveries_skipped
    assert again.redeliveries_skipped == 0
    assert await pubsub.pull(subscription, wait=12) == []  # the copies were acknowledged


@pytest.mark.parametrize("dead_letter_policy", [False, True])
async def test_to_message_fills_body_key_headers_id_lane_and_attempt(
    pubsub: PubSubAdmin, dead_letter_policy: bool
) -> None:
    topic = await pubsub.create_topic()
    dlq = await pubsub.create_topic() if dead_letter_policy else None
    subscription = await pubsub.create_subscription(topic, ordering=True, dead_letter_topic=dlq)
    await pubsub.publish(topic, ["héllo"], ordering_key="k-1", attributes={"trace": "t-1"})
    await pubsub.publish(topic, ["plain"])
    source = PubSubStreamProducer(subscription, ack_deadline=ACK_DEADLINE)
    stream = source.open_stream()
    messages: dict[bytes, Message] = {}
    try:
        while len(messages) < 2:
            raw, payload = await anext(stream)
            message = source.to_message(raw, payload)
            messages[message.body] = message
            assert message.id == raw.message.message_id == source.get_event_id(payload)
            assert message.lane == source.get_advance_lane(payload)
            assert message.raw is raw
    finally:
        await stream.aclose()
        await source.aclose()
    keyed, plain = messages["héllo".encode()], messages[b"plain"]
    assert (keyed.key, dict(keyed.headers), keyed.lane) == (b"k-1", {"trace": b"t-1"}, "k-1")
    assert (plain.key, dict(plain.headers)) == (None, {})
    # Pub/Sub counts delivery attempts only under a dead-letter policy; else the producer.
    assert keyed.attempt == plain.attempt == 1
