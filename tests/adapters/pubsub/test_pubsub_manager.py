"""ackgate's guarantees end to end: SharedStreamManager + PubSubStreamProducer + the emulator."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ackgate import (
    AdvanceOutcome,
    SharedStreamManager,
    Subscription,
    reject_shared_stream_event,
)
from ackgate_pubsub import REASON_ATTRIBUTE, SOURCE_ATTRIBUTE
from ackgate_test_support.reject_reasons import REASONS, reject_with_reasons

from .pubsub_support import PubSubAdmin, RecordingProducer, text

KEY = "pubsub"


async def read_all(sub: Subscription, expected: set[str]) -> set[str]:
    """Read until every expected body was seen, then leave cleanly."""
    seen: set[str] = set()
    async with sub:
        async for raw in sub:
            seen.add(text(raw))
            if seen >= expected:
                break
    return seen


async def test_four_subscribers_each_get_all_5000_messages_and_none_is_left(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    bodies = {f"m{i}" for i in range(5000)}
    await pubsub.publish(topic, sorted(bodies))
    producer = RecordingProducer(subscription, max_messages=1000, ack_deadline=30)
    made: list[RecordingProducer] = []

    def make() -> RecordingProducer:
        made.append(producer)
        return producer

    async with SharedStreamManager(ack_timeout=60) as manager:
        subs = [manager.subscribe(KEY, n, producer=make) for n in range(4)]
        async with asyncio.timeout(120):
            seen = await asyncio.gather(*(read_all(sub, bodies) for sub in subs))
    assert [len(s) for s in seen] == [5000] * 4
    assert made == [producer]  # one upstream poll for the four of them
    acked = {body for body, outcome in producer.advanced if outcome.is_clean}
    assert acked == bodies
    # Longer than the subscription's 10 s deadline: anything unacked would be back.
    assert await pubsub.pull(subscription, wait=12) == []


async def test_order_holds_per_ordering_key_and_keys_advance_independently(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic, ordering=True)
    keys, per_key = ["k0", "k1", "k2"], 30
    for start in range(0, per_key, 10):  # interleave the keys on the topic
        for key in keys:
            await pubsub.publish(
                topic, [f"{key}:{n}" for n in range(start, start + 10)], ordering_key=key
            )
    everything = {f"{key}:{n}" for key in keys for n in range(per_key)}
    producer = RecordingProducer(subscription)
    order: dict[str, dict[str, list[int]]] = {
        "holder": defaultdict(list),
        "reader": defaultdict(list),
    }
    held: list[int] = []
    finish = asyncio.Event()

    async def consume(name: str, sub: Subscription) -> None:
        async with sub:
            async for raw in sub:
                key, n = text(raw).split(":")
                order[name][key].append(int(n))
                if name == "holder" and text(raw) == "k0:0":
                    seq = sub.bind()  # an output of k0's head, left unconfirmed for now
                    assert seq is not None
                    held.append(seq)
                if sum(map(len, order[name].values())) == len(everything):
                    # Asking for the next event closes the window on the last one.
                    waiting = asyncio.ensure_future(anext(sub))
                    await finish.wait()
                    waiting.cancel()
                    break

    async with SharedStreamManager(ack_timeout=60) as manager:
        holder = manager.subscribe(KEY, "holder", producer=lambda: producer)
        reader = manager.subscribe(KEY, "reader", producer=lambda: producer)
        async with asyncio.timeout(60):
            consumers = asyncio.gather(consume("holder", holder), consume("reader", reader))
            others = everything - {f"k0:{n}" for n in range(per_key)}
            await producer.wait_until(lambda adv: {body for body, _ in adv} >= others)
            # k1 and k2 went through while k0 is held at its head.
            assert not [body for body, _ in producer.advanced if body.startswith("k0")]
            manager.confirm_persisted(held)
            await producer.wait_until(lambda adv: {body for body, _ in adv} == everything)
            finish.set()
            await consumers
    for name in order:
        assert order[name] == {key: list(range(per_key)) for key in keys}, name
    k0_advanced = [body for body, _ in producer.advanced if body.startswith("k0")]
    assert k0_advanced == [f"k0:{n}" for n in range(per_key)]
    assert all(outcome.is_clean for _, outcome in producer.advanced)


async def test_a_rejected_message_goes_to_the_explicit_dlq_topic(pubsub: PubSubAdmin) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    dlq_topic = await pubsub.create_topic()
    dlq = await pubsub.create_subscription(dlq_topic)
    await pubsub.publish(topic, [f"good{n}" for n in range(5)])
    await pubsub.publish(topic, ["poison"], ordering_key="pk", attributes={"kind": "poison"})
    everything = {f"good{n}" for n in range(5)} | {"poison"}
    producer = RecordingProducer(subscription, dlq_topic=dlq_topic)

    async def picky(sub: Subscription) -> None:
        seen: set[str] = set()
        async with sub:
            async for raw in sub:
                seen.add(text(raw))
                if text(raw) == "poison":
                    reject_shared_stream_event()
                if seen == everything:
                    break

    async with SharedStreamManager(ack_timeout=60) as manager:
        easy = manager.subscribe(KEY, "easy", producer=lambda: producer)
        strict = manager.subscribe(KEY, "strict", producer=lambda: producer)
        async with asyncio.timeout(30):
            await asyncio.gather(read_all(easy, everything), picky(strict))
    assert dict(producer.advanced)["poison"] == AdvanceOutcome(acked=1, failed=0, rejected=1)
    (dead,) = await pubsub.pull(dlq, wait=10)
    assert text(dead) == "poison"
    assert dead.message.ordering_key == "pk"
    attributes = dict(dead.message.attributes)
    assert attributes["kind"] == "poison"
    assert attributes[REASON_ATTRIBUTE] == "rejected by 1 of 2 subscribers"
    assert attributes[SOURCE_ATTRIBUTE] == subscription
    assert await pubsub.pull(subscription, wait=3) == []  # dead-lettered, then acked


async def test_the_dlq_reason_attribute_names_the_rejecting_subscribers_in_subscription_order(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    dlq_topic = await pubsub.create_topic()
    dlq = await pubsub.create_subscription(dlq_topic)
    await pubsub.publish(topic, ["{not json"], ordering_key="pk", attributes={"kind": "order"})
    producer = RecordingProducer(subscription, dlq_topic=dlq_topic)
    async with asyncio.timeout(30):
        raw = await reject_with_reasons(KEY, lambda: producer, ack_timeout=60)
    assert text(raw) == "{not json"
    assert producer.advanced == [
        ("{not json", AdvanceOutcome(acked=1, failed=0, rejected=2, reasons=REASONS))
    ]
    (dead,) = await pubsub.pull(dlq, wait=10)
    assert text(dead) == "{not json"
    assert dead.message.ordering_key == "pk"
    assert dict(dead.message.attributes) == {
        "kind": "order",
        SOURCE_ATTRIBUTE: subscription,
        REASON_ATTRIBUTE: "rejected by 2 of 3 subscribers; "
        "auditor: schema v3 unsupported; parser: bad json",
    }
    assert await pubsub.pull(subscription, wait=3) == []  # dead-lettered, then acked


async def test_a_rejected_message_reaches_the_subscriptions_dead_letter_topic(
    pubsub: PubSubAdmin,
) -> None:
    dlq_topic = await pubsub.create_topic()
    dlq = await pubsub.create_subscription(dlq_topic)
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(
        topic, dead_letter_topic=dlq_topic, max_delivery_attempts=5
    )
    await pubsub.publish(topic, ["poison"])
    producer = RecordingProducer(subscription)  # no dlq_topic: rejects are nacked
    attempts: list[int] = []
    async with SharedStreamManager(ack_timeout=60) as manager:
        sub = manager.subscribe(KEY, "strict", producer=lambda: producer)
        async with asyncio.timeout(30), sub:
            async for raw in sub:
                attempts.append(raw.delivery_attempt)
                reject_shared_stream_event()
                if raw.delivery_attempt == 5:
                    break
    assert attempts == [1, 2, 3, 4, 5]
    assert all(outcome.rejected == 1 for _, outcome in producer.advanced)
    (dead,) = await pubsub.pull(dlq, wait=10)
    assert text(dead) == "poison"
    assert dead.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert await pubsub.pull(subscription, wait=3) == []


async def test_a_failed_event_comes_back_promptly(pubsub: PubSubAdmin) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    await pubsub.publish(topic, ["x"])
    producer = RecordingProducer(subscription, ack_deadline=60)  # a lapse would take 60 s
    deliveries: list[tuple[str, str]] = []
    roster = {"crasher", "calm"}

    async def read(sub: Subscription) -> None:
        async with sub:
            async for raw in sub:
                deliveries.append((sub.subscriber_id, text(raw)))
                if text(raw) == "end":
                    return
                if sub.subscriber_id == "crasher" and len(deliveries) <= 2:
                    raise RuntimeError("handler crashed")
                if sub.subscriber_id == "crasher":
                    await pubsub.publish(topic, ["end"])

    async def crash_then_retry() -> None:
        with pytest.raises(RuntimeError):
            await read(manager.subscribe(KEY, "crasher", producer=lambda: producer, roster=roster))
        await read(manager.subscribe(KEY, "crasher", producer=lambda: producer, roster=roster))

    started = time.monotonic()
    async with SharedStreamManager(ack_timeout=60) as manager:
        calm = manager.subscribe(KEY, "calm", producer=lambda: producer, roster=roster)
        async with asyncio.timeout(30):
            await asyncio.gather(crash_then_retry(), read(calm))
    # The copy goes to the handler that crashed alone: "calm" acked the first
    # (docs/concepts.md#redelivery-memory).
    assert sorted(d for d in deliveries if d[1] == "x") == [
        ("calm", "x"),
        ("crasher", "x"),
        ("crasher", "x"),
    ]
    assert time.monotonic() - started < 20
    assert [a for a in producer.advanced if a[0] == "x"] == [
        ("x", AdvanceOutcome(acked=1, failed=1, rejected=0)),
        ("x", AdvanceOutcome(acked=2, failed=0, rejected=0)),
    ]
    assert await pubsub.pull(subscription, wait=3) == []


async def test_a_handler_slower_than_the_ack_deadline_sees_no_redelivery(
    pubsub: PubSubAdmin,
) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)  # 10 s ack deadline
    await pubsub.publish(topic, ["slow"])
    producer = RecordingProducer(subscription, ack_deadline=10)
    watcher_got: list[str] = []
    redelivered: asyncio.Future[Any] | None = None

    async def slow(sub: Subscription) -> None:
        async with sub:
            async for _ in sub:
                await asyncio.sleep(15)  # the handler's work, longer than the deadline
                break

    async def watcher(sub: Subscription) -> None:
        nonlocal redelivered
        async with sub:
            watcher_got.append(text(await anext(sub)))
            # A lapsed lease would hand "slow" out again while the slow handler works.
            redelivered = asyncio.ensure_future(anext(sub))
            await slow_done.wait()
            assert not redelivered.done()
            redelivered.cancel()

    slow_done = asyncio.Event()
    async with SharedStreamManager(ack_timeout=60) as manager:
        slow_sub = manager.subscribe(KEY, "slow", producer=lambda: producer)
        watch_sub = manager.subscribe(KEY, "watcher", producer=lambda: producer)
        async with asyncio.timeout(30):
            watching = asyncio.ensure_future(watcher(watch_sub))
            await slow(slow_sub)
            slow_done.set()
            await watching
    assert watcher_got == ["slow"]
    assert producer.advanced == [("slow", AdvanceOutcome(acked=2, failed=0, rejected=0))]
    assert await pubsub.pull(subscription, wait=3) == []


async def test_a_cancelled_and_restarted_consumer_loses_nothing(pubsub: PubSubAdmin) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic)
    bodies = {f"m{n}" for n in range(300)}
    await pubsub.publish(topic, sorted(bodies))
    stored: set[str] = set()
    midway = asyncio.Event()

    async def sink(body: str) -> None:
        stored.add(body)

    async def handle(events: AsyncIterator[Any]) -> AsyncIterator[str]:
        async for raw in events:
            await asyncio.sleep(0.001)  # a little work per event
            yield text(raw)
            if len(stored) >= 100:
                midway.set()
            if stored >= bodies:
                return

    def make() -> RecordingProducer:  # a fresh producer for each group
        return RecordingProducer(subscription, max_messages=50, ack_deadline=10)

    async with SharedStreamManager(ack_timeout=60) as manager:
        first = asyncio.ensure_future(
            manager.run_subscriber(KEY, "svc", handle, producer=make, sink=sink)
        )
        async with asyncio.timeout(30):
            await midway.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert len(stored) < len(bodies)  # it really stopped mid-stream

    async with SharedStreamManager(ack_timeout=60) as manager:
        async with asyncio.timeout(40):
            await manager.run_subscriber(KEY, "svc", handle, producer=make, sink=sink)
    assert stored == bodies
    assert await pubsub.pull(subscription, wait=3) == []


async def test_an_exactly_once_subscription_acks_cleanly(pubsub: PubSubAdmin) -> None:
    topic = await pubsub.create_topic()
    subscription = await pubsub.create_subscription(topic, exactly_once=True)
    bodies = {f"e{n}" for n in range(20)}
    await pubsub.publish(topic, sorted(bodies))
    producer = RecordingProducer(subscription)
    async with SharedStreamManager(ack_timeout=60) as manager:
        async with asyncio.timeout(30):
            assert (
                await read_all(manager.subscribe(KEY, "only", producer=lambda: producer), bodies)
                == bodies
            )
    assert {body for body, outcome in producer.advanced if outcome.is_clean} == bodies
    assert await pubsub.pull(subscription, wait=3) == []
