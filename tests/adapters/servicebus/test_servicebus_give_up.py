"""docs/failure-semantics.md#poison-messages on Service Bus (the fake broker): ``Message.attempt``
is ``delivery_count + 1`` and counts up across redeliveries; a message that always fails is
dead-lettered to the entity's dead-letter sub-queue after ``give_up_after`` attempts, with the
reason, before the entity's own MaxDeliveryCount, and nothing else is lost."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

from ackgate import Message, Redelivery, Service
from ackgate_servicebus import DEAD_LETTER_REASON, ServiceBusStreamProducer

from .fake_servicebus import FakeServiceBus


async def test_a_message_that_always_fails_is_dead_lettered_after_give_up_after_attempts() -> None:
    bus = FakeServiceBus(lock_duration=30.0, max_delivery_count=10)
    bus.create_queue("q")
    bodies = ["poison", *(f"ok-{n}" for n in range(5))]
    for body in bodies:
        bus.send("q", body)
    producer = ServiceBusStreamProducer(  # made once: the test reads its destination
        client_factory=bus.client, queue_name="q", max_wait_time=0.05
    )
    service = Service(
        "sb", producer=lambda: producer, redelivery=Redelivery(backoff=0.2, max_backoff=0.4)
    )
    attempts: list[int | None] = []
    # Each hand-out's broker delivery and loop time: the same delivery, after a backoff.
    raws: list[Any] = []
    times: list[float] = []
    handled: dict[str, Counter[str]] = {"picky": Counter(), "other": Counter()}

    @service.handler("picky", give_up_after=3)
    async def picky(message: Message) -> None:
        if message.body == b"poison":
            attempts.append(message.attempt)
            raws.append(message.raw)
            times.append(asyncio.get_running_loop().time())
            raise ValueError("bad row")
        handled["picky"][message.body.decode()] += 1

    @service.handler("other")
    async def other(message: Message) -> None:
        if message.body != b"poison":
            handled["other"][message.body.decode()] += 1

    entity = bus.entities["q"]
    async with asyncio.timeout(30):
        running = asyncio.create_task(service.run())
        await bus.wait_until(lambda: entity.active_count() == 0)
        await service.stop()
        await running
    assert attempts == [1, 2, 3]
    # Handed again in-process (the broker never redelivered it), after each backoff's
    # lower bound (half its ceiling): 0.1 s, then 0.2 s.
    assert all(raw is raws[0] for raw in raws)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19, gaps
    assert handled["picky"] == handled["other"] == Counter(bodies[1:])  # nothing else lost
    assert [stored.body for stored in entity.completed] == [b.encode() for b in bodies[1:]]
    (dead,) = entity.dead_lettered
    assert (dead.body, dead.dead_letter_reason) == (b"poison", DEAD_LETTER_REASON)
    assert dead.dead_letter_error_description == (
        "rejected by 1 of 2 ackgate subscribers; picky: gave up after 3 attempts: "
        "ValueError: bad row"
    )
    assert service.stats().handlers["picky"].gave_up == 1
    assert producer.dead_letter_destination() == "the dead-letter sub-queue of queue 'q'"
